/* calibrate.h: `dmc calibrate`, which measures this machine and writes a hardware file
 * for --hardware (docs/calibrate.md). The measuring is done by a program of the runtime
 * (runtime/calibrate.c); this finds it and runs it, under mpirun for --backend mpi. */
#ifndef DMC_CALIBRATE_H
#define DMC_CALIBRATE_H

/* argv[0] is "calibrate", the options follow. Does not return when the program starts
 * (dmc becomes it); returns 2 after a usage error, 1 when the program cannot be run. */
int dm_calibrate_main(int argc, char **argv);

#endif
