/*
 * check_generated: static checks for C code emitted by dmc.
 *
 * Usage: check_generated --prefix PREFIX [-I DIR ...] [-D MACRO ...]
 *                        [--allow NAME ...] FILE.c [FILE.h ...]
 *
 * Each file is parsed with libclang (-std=c11 -Wall -Wextra plus the given
 * -I/-D options; headers additionally with -x c).  A file fails when:
 *   - libclang reports a diagnostic of severity warning or above;
 *   - it defines or declares a file-scope variable that is not
 *     const-qualified (for arrays: the element type, so that
 *     `static const char *x[]` fails while `static const char *const x[]`
 *     passes);
 *   - a function or variable with external linkage does not start with
 *     PREFIX (exact, case-sensitive) and was not named with --allow;
 *   - (headers only) a typedef, struct/union/enum tag, enum constant or
 *     macro does not start with PREFIX (case-insensitive, so `MLP_` macros
 *     match prefix `mlp_`).
 *
 * Exit status: 0 all files pass, 1 problems found, 2 usage error or a file
 * that cannot be read or parsed.
 */
#include <clang-c/Index.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_CLANG_ARGS = 256 };

static const char usage_text[] =
    "usage: check_generated --prefix PREFIX [-I DIR ...] [-D MACRO ...]\n"
    "                       [--allow NAME ...] FILE.c [FILE.h ...]\n";

typedef struct {
    const char *prefix;
    const char **allow;  /* names exempt from the external-prefix rule */
    int n_allow;
} cg_options;

/* State threaded through the cursor visitors. */
typedef struct {
    const cg_options *opts;
    const char *path;   /* file name as given on the command line */
    int is_header;
    unsigned problems;
} cg_file_ctx;

static int has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s);
    size_t m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int has_prefix_exact(const char *name, const char *prefix)
{
    return strncmp(name, prefix, strlen(prefix)) == 0;
}

static int has_prefix_nocase(const char *name, const char *prefix)
{
    size_t i;
    for (i = 0; prefix[i] != '\0'; i++) {
        if (name[i] == '\0')
            return 0;
        if (tolower((unsigned char)name[i]) != tolower((unsigned char)prefix[i]))
            return 0;
    }
    return 1;
}

static int is_allowed(const cg_options *opts, const char *name)
{
    int i;
    for (i = 0; i < opts->n_allow; i++) {
        if (strcmp(opts->allow[i], name) == 0)
            return 1;
    }
    return 0;
}

static unsigned cursor_line(CXCursor c)
{
    unsigned line = 0;
    clang_getSpellingLocation(clang_getCursorLocation(c), NULL, &line, NULL, NULL);
    return line;
}

static int in_main_file(CXCursor c)
{
    return clang_Location_isFromMainFile(clang_getCursorLocation(c)) != 0;
}

/* Const-ness of a variable's type; for arrays, of the innermost element.
 * In clang's canonical form the qualifiers of `const T[N]` sit on the array
 * type itself and clang_getArrayElementType drops them, so look for const at
 * every level on the way down. */
static int type_is_const(CXType t)
{
    for (;;) {
        t = clang_getCanonicalType(t);
        if (clang_isConstQualifiedType(t))
            return 1;
        switch (t.kind) {
        case CXType_ConstantArray:
        case CXType_IncompleteArray:
        case CXType_VariableArray:
        case CXType_DependentSizedArray:
            t = clang_getArrayElementType(t);
            break;
        default:
            return 0;
        }
    }
}

/* Anonymous structs/unions/enums have no tag to check. */
static int tag_is_unnamed(CXCursor c, const char *name)
{
    if (name[0] == '\0')
        return 1;
    if (clang_Cursor_isAnonymous(c))
        return 1;
    /* Older/newer libclang spell unnamed tags as "... (unnamed at ...)" or
     * "(anonymous ...)". */
    return strstr(name, "(unnamed") != NULL || strstr(name, "(anonymous") != NULL;
}

static void report_name(cg_file_ctx *ctx, CXCursor c, const char *what, const char *name)
{
    printf("%s:%u: %s '%s' lacks prefix '%s'\n", ctx->path, cursor_line(c), what, name,
           ctx->opts->prefix);
    ctx->problems++;
}

static void check_type_name(cg_file_ctx *ctx, CXCursor c, const char *what)
{
    CXString s = clang_getCursorSpelling(c);
    const char *name = clang_getCString(s);
    if (name == NULL)
        name = "";
    if (!tag_is_unnamed(c, name) && !has_prefix_nocase(name, ctx->opts->prefix) &&
        !is_allowed(ctx->opts, name))
        report_name(ctx, c, what, name);
    clang_disposeString(s);
}

static enum CXChildVisitResult visit_tag_children(CXCursor c, CXCursor parent,
                                                  CXClientData data);

/* Checks a struct/union/enum tag (headers only) and what it contains:
 * enum constants and nested tag declarations, which have file scope in C. */
static void check_tag(cg_file_ctx *ctx, CXCursor c)
{
    const char *what = "struct tag";
    if (c.kind == CXCursor_UnionDecl)
        what = "union tag";
    else if (c.kind == CXCursor_EnumDecl)
        what = "enum tag";
    check_type_name(ctx, c, what);
    clang_visitChildren(c, visit_tag_children, ctx);
}

static enum CXChildVisitResult visit_tag_children(CXCursor c, CXCursor parent,
                                                  CXClientData data)
{
    cg_file_ctx *ctx = data;
    (void)parent;
    if (!in_main_file(c))
        return CXChildVisit_Continue;
    switch (c.kind) {
    case CXCursor_EnumConstantDecl:
        check_type_name(ctx, c, "enum constant");
        break;
    case CXCursor_StructDecl:
    case CXCursor_UnionDecl:
    case CXCursor_EnumDecl:
        check_tag(ctx, c);
        break;
    default:
        break;
    }
    return CXChildVisit_Continue;
}

static void check_var(cg_file_ctx *ctx, CXCursor c)
{
    if (!type_is_const(clang_getCursorType(c))) {
        CXString s = clang_getCursorSpelling(c);
        printf("%s:%u: mutable file-scope variable '%s'\n", ctx->path, cursor_line(c),
               clang_getCString(s));
        clang_disposeString(s);
        ctx->problems++;
    }
}

static void check_linkage(cg_file_ctx *ctx, CXCursor c)
{
    CXString s;
    const char *name;
    if (clang_getCursorLinkage(c) != CXLinkage_External)
        return;
    s = clang_getCursorSpelling(c);
    name = clang_getCString(s);
    if (name == NULL)
        name = "";
    if (!has_prefix_exact(name, ctx->opts->prefix) && !is_allowed(ctx->opts, name)) {
        printf("%s:%u: external symbol '%s' lacks prefix '%s'\n", ctx->path, cursor_line(c),
               name, ctx->opts->prefix);
        ctx->problems++;
    }
    clang_disposeString(s);
}

static enum CXChildVisitResult visit_top_level(CXCursor c, CXCursor parent,
                                               CXClientData data)
{
    cg_file_ctx *ctx = data;
    (void)parent;
    if (!in_main_file(c))
        return CXChildVisit_Continue;
    switch (c.kind) {
    case CXCursor_VarDecl:
        check_var(ctx, c);
        check_linkage(ctx, c);
        break;
    case CXCursor_FunctionDecl:
        check_linkage(ctx, c);
        break;
    case CXCursor_TypedefDecl:
        if (ctx->is_header)
            check_type_name(ctx, c, "typedef");
        break;
    case CXCursor_StructDecl:
    case CXCursor_UnionDecl:
    case CXCursor_EnumDecl:
        if (ctx->is_header)
            check_tag(ctx, c);
        break;
    case CXCursor_MacroDefinition:
        if (ctx->is_header && !clang_Cursor_isMacroBuiltin(c))
            check_type_name(ctx, c, "macro");
        break;
    default:
        break;
    }
    return CXChildVisit_Continue;
}

static const char *severity_name(enum CXDiagnosticSeverity sev)
{
    switch (sev) {
    case CXDiagnostic_Warning:
        return "warning";
    case CXDiagnostic_Error:
        return "error";
    case CXDiagnostic_Fatal:
        return "fatal error";
    default:
        return "note";
    }
}

static unsigned report_diagnostics(CXTranslationUnit tu, const char *path)
{
    unsigned i;
    unsigned n = clang_getNumDiagnostics(tu);
    unsigned problems = 0;
    for (i = 0; i < n; i++) {
        CXDiagnostic d = clang_getDiagnostic(tu, i);
        enum CXDiagnosticSeverity sev = clang_getDiagnosticSeverity(d);
        if (sev >= CXDiagnostic_Warning) {
            CXFile file = NULL;
            unsigned line = 0;
            unsigned col = 0;
            CXString msg = clang_getDiagnosticSpelling(d);
            CXString fname;
            const char *fn;
            clang_getSpellingLocation(clang_getDiagnosticLocation(d), &file, &line, &col,
                                      NULL);
            fname = clang_getFileName(file);
            fn = clang_getCString(fname);
            if (fn == NULL || fn[0] == '\0')
                fn = path;
            printf("%s:%u:%u: %s: %s\n", fn, line, col, severity_name(sev),
                   clang_getCString(msg));
            clang_disposeString(fname);
            clang_disposeString(msg);
            problems++;
        }
        clang_disposeDiagnostic(d);
    }
    return problems;
}

/* Returns the number of problems, or -1 if the file could not be parsed. */
static long check_file(CXIndex index, const cg_options *opts, const char *path,
                       const char *const *base_args, int n_base)
{
    const char *args[MAX_CLANG_ARGS + 8];
    int nargs = 0;
    int i;
    int is_header = has_suffix(path, ".h");
    CXTranslationUnit tu = NULL;
    enum CXErrorCode err;
    cg_file_ctx ctx;
    FILE *f = fopen(path, "r");

    if (f == NULL) {
        fprintf(stderr, "check_generated: cannot open '%s'\n", path);
        return -1;
    }
    fclose(f);

    if (is_header) {
        args[nargs++] = "-x";
        args[nargs++] = "c";
    }
    args[nargs++] = "-std=c11";
    args[nargs++] = "-Wall";
    args[nargs++] = "-Wextra";
    if (is_header) {
        /* A header parsed on its own is the main file, which makes clang
         * warn about things that are legitimate in a header: `#pragma once`
         * and unused static inline functions / static const variables. */
        args[nargs++] = "-Wno-pragma-once-outside-header";
        args[nargs++] = "-Wno-unused-function";
        args[nargs++] = "-Wno-unused-const-variable";
    }
    for (i = 0; i < n_base; i++)
        args[nargs++] = base_args[i];

    err = clang_parseTranslationUnit2(index, path, args, nargs, NULL, 0,
                                      CXTranslationUnit_DetailedPreprocessingRecord, &tu);
    if (err != CXError_Success || tu == NULL) {
        fprintf(stderr, "check_generated: libclang could not parse '%s' (error %d)\n", path,
                (int)err);
        return -1;
    }

    ctx.opts = opts;
    ctx.path = path;
    ctx.is_header = is_header;
    ctx.problems = report_diagnostics(tu, path);
    clang_visitChildren(clang_getTranslationUnitCursor(tu), visit_top_level, &ctx);
    clang_disposeTranslationUnit(tu);
    return (long)ctx.problems;
}

static int usage_error(const char *msg)
{
    if (msg != NULL)
        fprintf(stderr, "check_generated: %s\n", msg);
    fputs(usage_text, stderr);
    return 2;
}

int main(int argc, char **argv)
{
    cg_options opts;
    const char *clang_args[MAX_CLANG_ARGS];
    int n_clang_args = 0;
    const char **files;
    const char **allow;
    int n_files = 0;
    int i;
    int status;
    unsigned long problems = 0;
    CXIndex index;

    opts.prefix = NULL;
    opts.n_allow = 0;
    files = calloc((size_t)argc + 1, sizeof *files);
    allow = calloc((size_t)argc + 1, sizeof *allow);
    if (files == NULL || allow == NULL) {
        fprintf(stderr, "check_generated: out of memory\n");
        free(files);
        free(allow);
        return 2;
    }
    opts.allow = allow;

    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--prefix") == 0 || strcmp(a, "--allow") == 0 ||
            strcmp(a, "-I") == 0 || strcmp(a, "-D") == 0) {
            if (i + 1 >= argc) {
                free(files);
                free(allow);
                return usage_error("option requires an argument");
            }
            if (strcmp(a, "--prefix") == 0) {
                opts.prefix = argv[++i];
            } else if (strcmp(a, "--allow") == 0) {
                allow[opts.n_allow++] = argv[++i];
            } else {
                if (n_clang_args + 2 > MAX_CLANG_ARGS) {
                    free(files);
                    free(allow);
                    return usage_error("too many -I/-D options");
                }
                clang_args[n_clang_args++] = a;
                clang_args[n_clang_args++] = argv[++i];
            }
        } else if (strncmp(a, "--prefix=", 9) == 0) {
            opts.prefix = a + 9;
        } else if (strncmp(a, "--allow=", 8) == 0) {
            allow[opts.n_allow++] = a + 8;
        } else if ((strncmp(a, "-I", 2) == 0 || strncmp(a, "-D", 2) == 0) && a[2] != '\0') {
            if (n_clang_args + 1 > MAX_CLANG_ARGS) {
                free(files);
                free(allow);
                return usage_error("too many -I/-D options");
            }
            clang_args[n_clang_args++] = a;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            free(files);
            free(allow);
            fputs(usage_text, stdout);
            return 0;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "check_generated: unknown option '%s'\n", a);
            free(files);
            free(allow);
            return usage_error(NULL);
        } else {
            files[n_files++] = a;
        }
    }

    if (opts.prefix == NULL || opts.prefix[0] == '\0') {
        free(files);
        free(allow);
        return usage_error("--prefix PREFIX is required");
    }
    if (n_files == 0) {
        free(files);
        free(allow);
        return usage_error("no input files");
    }

    index = clang_createIndex(0, 0);
    status = 0;
    for (i = 0; i < n_files; i++) {
        long n = check_file(index, &opts, files[i], clang_args, n_clang_args);
        if (n < 0) {
            status = 2;
            continue;
        }
        problems += (unsigned long)n;
    }
    clang_disposeIndex(index);

    printf("check_generated: %d files, %lu problems\n", n_files, problems);
    free(files);
    free(allow);
    if (status != 0)
        return status;
    return problems > 0 ? 1 : 0;
}
