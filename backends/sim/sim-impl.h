/*
 * sim internals shared by the files of backends/sim/ (config, reg/device, buffer,
 * backend). Not a public header: only the .c files of backends/sim include it.
 *
 * Object layout: one loom__sim_reg block holds the reg and all its devices inline (so the
 * default reg can live in static storage, and a module unloaded with dlclose leaves no
 * heap behind); each device holds its private buffer type inline.
 */
#ifndef LOOM_SIM_IMPL_H
#define LOOM_SIM_IMPL_H

#include <pthread.h>

#include "backends/backend-impl.h"
#include "loom/sim.h"

#define LOOM_SIM_MAX_DEVICES 64
#define LOOM_SIM_ALIGNMENT 128 /* bytes; buffer base and tensor offsets */

typedef struct loom__sim_reg loom__sim_reg;

typedef struct loom__sim_dev {
    struct loom_dev dev;   /* dev.context = this */
    struct loom_buft buft; /* private memory "SIMk"; buft.context = this */
    loom__sim_reg *sreg;
    int index;
    char name[32]; /* "SIM0", "SIM5": process-wide number */
    char desc[160];
    pthread_mutex_t mu; /* guards everything below */
    size_t mem_used;    /* bytes of live buffers */
    size_t mem_peak;
    loom_sim_stats stats; /* counters (mem_* fields filled on read) */
    int n_buffers;        /* live buffers of the private buffer type */
    int n_backends;       /* live backends (command streams) */
} loom__sim_dev;

struct loom__sim_reg {
    struct loom_reg reg; /* reg.context = this */
    loom_sim_config cfg;
    char name[32];  /* "SIM" (holds SIM0), else "SIM2..SIM3" or "SIM4" */
    int base;       /* first device number, released by loom_sim_reg_free */
    bool is_static; /* the default reg: never freed */
    /* cfg.profile resolved, or NULL */
    const loom_sim_profile *profile;
    loom__sim_dev devs[LOOM_SIM_MAX_DEVICES];
};

/* ---------------------------------------------------------------- sim-config.c */

/* "3.00 GiB", "1.20 MiB", "512 B". */
void loom__sim_format_size(size_t bytes, char *buf, size_t size);

/* ---------------------------------------------------------------- sim-reg.c */

/* The sim device behind dev, or NULL if dev is not a sim device of this library. */
loom__sim_dev *loom__sim_dev_of(loom_dev_t dev);
bool loom__sim_dev_supports_buft(loom__sim_dev *sd, loom_buft_t buft);
bool loom__sim_dev_supports_op(loom__sim_dev *sd, const loom_tensor *op);

/* ---------------------------------------------------------------- sim-buffer.c */

extern const struct loom_buft_i loom__sim_buft_i;
/* The sim device owning buf's private memory, or NULL (host or another backend). */
loom__sim_dev *loom__sim_buffer_dev(loom_buffer_t buf);
/* Link accounting of one transfer of `bytes` from -> to (NULL = the host). */
void loom__sim_account(loom__sim_dev *from, loom__sim_dev *to, size_t bytes);

/* ---------------------------------------------------------------- sim-backend.c */

loom_backend_t loom__sim_backend_new(loom__sim_dev *sd, const char *params);
loom_event_t loom__sim_event_new(loom_dev_t dev);
void loom__sim_event_free(loom_dev_t dev, loom_event_t ev);
void loom__sim_event_synchronize(loom_dev_t dev, loom_event_t ev);
/* The native communicator (LOOM_PROC_COMM_*, include/loom/reduce.h). */
void *loom__sim_comm_init(loom_backend_t *backends, size_t n);
bool loom__sim_comm_allreduce(void *comm, loom_tensor *const *tensors, size_t n);
void loom__sim_comm_free(void *comm);

#endif /* LOOM_SIM_IMPL_H */
