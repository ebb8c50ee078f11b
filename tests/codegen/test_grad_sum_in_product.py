#!/usr/bin/python3
"""test_grad_sum_in_product.py: gradient accumulation made by the weight gradients' products
(meson test `codegen-grad-sum-in-product`; passes/memory.c's made_in_sum,
codegen/emit_ops.c, docs/compiler.md "Gradient sums in the products").

usage: /usr/bin/python3 tests/codegen/test_grad_sum_in_product.py DMC SOURCE_ROOT

The rule, not a run of dmc, says which products make their sums: with several micro-batches
summed for one update, a parameter whose gradient is a product (x^T dy: mlp.dm's 2-D
weights) has it written straight into the step's sum in ctx->grad_sum, beta 0 for the
first micro-batch and 1 after; a 1-D bias's gradient (a reduction) is still added by a
pass. The sums are laid out as the gradients are: in declaration order, each rounded up to
16 elements, so each weight's place follows from the parameters' sizes. Checked on one
device (--accumulate 4, the micro-batch gradient is the gradient buffer), data=2 (it is a
temporary the allreduce reads: no arena buffer), pipeline=2, the CUDA target, and
pipedream (which updates after each micro-batch: nothing made in a sum); gpt.dm's fused
q/k/v weight, whose three products each make their window of its sum; gpt.dm's tied wte on
one rank, whose sum the head's product makes and the embedding's gradient adds to;
llama.dm's embedding table, whose rows are added into its sum (zeroed by the first
micro-batch); gpt.dm's head on
the last of two stages, whose [V, C] partial gradient of the tied wte.weight is made in its
own sum, sent once a step. The values are checked by the spmd suite's accumulation and
pipeline meshes against the serial program (docs/parallelism.md), and the cost model's
pricing of the remaining passes by explain-cost-model.

Exit status: 0 pass, 1 failure, 2 usage.
"""
import json
import os
import re
import subprocess
import sys

from generated import generate, run

FUSED = "micro > 0 ? 1.0f : 0.0f"


def sum_places(dmc, model, args):
    """{parameter: its gradient's offset in the sums} from --explain=json's parameters."""
    out = subprocess.run([dmc, "--explain=json", model] + args, check=True, capture_output=True, text=True).stdout
    at, places = 0, {}
    for p in json.loads(out)["params"]:
        places[p["name"]] = (at, p["type"].count(",") > 0)
        at += -(-p["elements"] // 16) * 16
    return places


def declared(code):
    """{name: where} of each buffer the micro-batches' backward functions declare."""
    found = {}
    for fn in re.split(r"\nstatic int ", code):
        if fn.split("(")[0].endswith("backward"):
            found.update(re.findall(r"float \*(\w+) = ([^;]+);", fn))
    return found


def check_mlp(check, dmc, mlp, label, args, tmp, ext=".c"):
    code = generate(dmc, mlp, args, os.path.join(tmp, label.replace("=", "").replace(" ", "_")), ext)
    places, where = sum_places(dmc, mlp, args), declared(code)
    products = [l for l in code.splitlines() if FUSED in l]
    weights = [n for n, (_, is_weight) in places.items() if is_weight]
    check(len(products) == len(weights), "mlp.dm %s: %d products make their sums, one a weight (%d)" %
          (label, len(products), len(weights)))
    for name, (at, is_weight) in places.items():
        # (a gradient the data axis reduces is a temporary: NAME_grad_partial)
        var = next((v for v in (name.replace(".", "_") + "_grad", name.replace(".", "_") + "_grad_partial")
                    if v in where), None)
        added = "/* %s's gradient, added to the step's" % name in code
        if is_weight:
            fused = [l for l in products if re.search(r"\b%s\b" % var, l)] if var else []
            check(where.get(var) == "ctx->grad_sum + %d" % at and len(fused) == 1 and not added,
                  "mlp.dm %s: %s's gradient made by its product at ctx->grad_sum + %d (declared %s, %d products, "
                  "added by a pass: %s)" % (label, name, at, where.get(var), len(fused), added))
        else:
            check(added, "mlp.dm %s: %s's gradient (a reduction) added by a pass" % (label, name))


def body(check, dmc, root, tmp):
    mlp = os.path.join(root, "examples/mlp.dm")
    check_mlp(check, dmc, mlp, "accumulate 4", ["--accumulate", "4"], tmp)
    check_mlp(check, dmc, mlp, "data=2 x 2", ["--mesh", "data=2", "--accumulate", "2"], tmp)
    check_mlp(check, dmc, mlp, "cuda accumulate 4", ["--accumulate", "4", "--target", "cuda"], tmp, ".cu")

    code = generate(dmc, mlp, ["--mesh", "data=2", "--accumulate", "2"], os.path.join(tmp, "arena"))
    arena = [n for n, w in declared(code).items() if n.endswith("_weight_grad") and "arena" in w]
    check(not arena, "mlp.dm data=2 x 2: no weight gradient has an arena buffer (%s)" % arena)

    code = generate(dmc, mlp, ["--mesh", "pipeline=2", "--microbatches", "4"], os.path.join(tmp, "pipe"))
    check(code.count(FUSED) == 3, "mlp.dm pipeline=2 x 4: the 3 weights' products make their sums (%d)" % code.count(FUSED))

    code = generate(dmc, mlp, ["--mesh", "pipeline=2", "--microbatches", "4", "--schedule", "pipedream"],
                    os.path.join(tmp, "pipedream"))
    check(FUSED not in code and code.count("for this micro-batch's update") == 6,
          "mlp.dm pipedream: every gradient copied for its micro-batch's update, none made in a sum")

    code = generate(dmc, mlp, [], os.path.join(tmp, "one"))
    check(FUSED not in code and "grad_sum" not in code, "mlp.dm, one micro-batch: no sums")

    gpt = os.path.join(root, "examples/gpt.dm")
    for label, args in (("accumulate 2", ["--accumulate", "2"]), ("data=2 x 2", ["--mesh", "data=2", "--accumulate", "2"])):
        code = generate(dmc, gpt, ["--set", "V=64,T=16,C=32,NH=4,L=2,B=4"] + args, os.path.join(tmp, "gpt" + args[1]))
        windows = code.count("made in its window of the step's sum")
        # per layer: attn.c_proj, mlp.c_fc and mlp.c_proj's products, and c_attn's q, k and v
        # products each in its window of the fused weight's sum; and the tied wte's: the
        # head's product makes the sum, the embedding's gradient adds its rows to it
        pieces = re.findall(r"float \*\w+ = (ctx->\w+) \+ \d+; /\* f32\[C, C\]\S*, in its window of the sum", code)
        where = declared(code)
        head = [l for l in code.splitlines() if FUSED in l and "d_wte_weight," in l]
        check(code.count(FUSED) == 2 * 6 + 1 and windows == 2 * 3 and pieces == ["ctx->grad_sum"] * 6 and len(head) == 1,
              "gpt.dm %s: 13 products make their sums, 6 of them in c_attn's windows, one the head's (%d, %d, %d, "
              "pieces declared at %s)" % (label, code.count(FUSED), windows, len(head), pieces))
        embed = re.findall(r"/\* (d_wte_weight_\d+), added to the step's sum over the micro-batches, which was written "
                           r"before it \*/", code)
        check(len(embed) == 1 and "memset(%s," % embed[0] not in code and
              (where.get(embed[0]) or "?") == where.get("d_wte_weight") and
              "wte.weight's gradient, added to the step's" not in code,
              "gpt.dm %s: wte's embedding gradient adds its rows to the sum the head's product made (%s at %s)" %
              (label, embed, where.get(embed[0]) if embed else None))

    # an embedding table's gradient (llama.dm's, untied): its rows added into the sum, which
    # the first micro-batch zeroes; on CUDA the runtime's call told to add
    llama = os.path.join(root, "examples/llama.dm")
    for label, args, ext in (("accumulate 2", ["--accumulate", "2"], ".c"),
                             ("data=2 x tensor=2 x 2, cuda", ["--mesh", "data=2,tensor=2", "--accumulate", "2",
                                                              "--target", "cuda"], ".cu")):
        code = generate(dmc, llama, ["--set", "V=64,T=8,C=32,NH=4,F=48,L=2,B=4"] + args,
                        os.path.join(tmp, "llama" + str(len(args))), ext)
        var = "model_embed_tokens_weight_grad" + ("_partial" if "data=2" in label else "")
        at = declared(code).get(var, "")
        made = ("if (!(micro > 0))\n        memset(%s, 0," % var in code if ext == ".c" else
                re.search(r"dmrt_gpu_embed_grad\(ctx->gpu, [^;]*\b%s, [^;]*, micro > 0, ctx->scratch\)" % var, code))
        check(at.startswith("ctx->grad_sum") and made and
              "model.embed_tokens.weight's gradient, added to the step's" not in code,
              "llama.dm %s: the embedding's gradient made in its sum (declared at %s)" % (label, at))

    args = ["--set", "V=64,T=16,C=32,NH=4,L=2,B=4", "--mesh", "pipeline=2", "--microbatches", "2"]
    code = generate(dmc, gpt, args, os.path.join(tmp, "gpt"))
    last = code[code.index("static int stage1_backward"):]
    last = last[:last.index("\n}\n")]
    where = dict(re.findall(r"float \*(\w+) = ([^;]+);", last))
    product = [l for l in last.splitlines() if FUSED in l and "d_wte_weight" in l]
    sent = re.search(r"dmrt_send\([^,]+, 0, (ctx->grad_sum \+ \d+), 2048,", code)
    check(where.get("d_wte_weight", "").startswith("ctx->grad_sum") and len(product) == 1 and sent is not None and
          sent.group(1) == where.get("d_wte_weight") and "partial gradient, added to the step's sum" not in code,
          "gpt.dm pipeline=2 x 2: the head's partial of wte.weight made in its sum (%s), the sum sent once a step (%s)" %
          (where.get("d_wte_weight"), sent.group(1) if sent else None))


if __name__ == "__main__":
    sys.exit(run(sys.argv, __doc__, "dmc-grad-sum-in-product-", body))
