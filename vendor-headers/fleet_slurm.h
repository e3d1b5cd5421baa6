/*
 * Fleet's wrapper header for bindgen. It includes the installed Slurm
 * headers (libslurm-dev, or $SLURM_INCLUDE_DIR) and declares the few
 * functions that slurmctld/slurmd export from libslurmfull but that no
 * public header declares. Nothing here is a copy of Slurm's headers.
 *
 * Those functions are resolved at load time from the process that
 * dlopen()s our plugin (slurmctld, slurmd, sbatch); the plugins do not
 * link against libslurm themselves.
 */
#ifndef FLEET_SLURM_H
#define FLEET_SLURM_H

#include <stdint.h>
#include <stdbool.h>
#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>
#include <slurm/spank.h>

/* Slurm's allocator: slurmctld xfree()s every string a plugin stores in
 * job_desc, so those strings must come from here. */
extern char *slurm_xstrdup(const char *str);
extern void slurm_xfree(void **item);

/* Slurm's logger (log.h is not installed). */
extern void slurm_info(const char *fmt, ...);
extern void slurm_verbose(const char *fmt, ...);
extern void slurm_debug(const char *fmt, ...);
extern void slurm_error(const char *fmt, ...);

/* SHOW_ALL as a value bindgen can read: 24.11 defines it through a
 * function-like macro (SLURM_BIT(0)), which bindgen does not expand. */
static const uint16_t FLEET_SHOW_ALL = SHOW_ALL;

#endif
