/* skip.c: stands in for the MPI tests where MPI or mpirun was not found at configure
 * time; meson reports it as skipped (exit status 77). */
#include <stdio.h>

int main(int argc, char **argv) {
    printf("skipped: %s\n", argc > 1 ? argv[1] : "not available");
    return 77;
}
