/*
 * A simulated libnvidia-ml.so.1 for jax_nbmem's tests and no-GPU demo.
 *
 * It answers NVML calls (through the real pynvml, or any other NVML client) from a small text
 * "state file" named by $JAX_NBMEM_SIMGPU_STATE. The variable is looked up and the file read on
 * every call, so another process (or Python code changing os.environ) can change what the "GPU"
 * reports at any time.
 *
 * The format is documented in jax_nbmem/simgpu/state_format.py (STATE_FORMAT, shown by
 * `python -m jax_nbmem.simgpu --help`), whose Python reader (state_parse.py) follows the same
 * rules: a state is used only when it is complete (it ends with an `end` line) and reads the
 * same twice in a row, so a file rewritten in place is never used half-written; a file with a
 * problem (a malformed line, a missing field, a gap in the GPU indices) is reported once on
 * stderr, naming the line, and the last good state of that file stays in use.
 * jaxNbmemSimCheck() exposes this parser to the tests, which feed the same lines to both
 * readers and compare.
 *
 * Functions that are not defined here are simply not exported; pynvml then raises
 * NVMLError_FunctionNotFound, exactly as with an old driver. Building with -DSIM_OLD_DRIVER
 * leaves out nvmlDeviceGetMemoryInfo_v2 and the _v3 process lists for that reason.
 *
 * Three parts, one library: this file (the types and the calls jax_nbmem makes), nvml_state.c
 * (the state file: its parser, the state in use, its canonical text; nvml_file.c opens and
 * reads the file) and nvml_clients.c (what other clients ask, and MIG; nvml_query.c and
 * nvml_host.c: what nvidia-smi -q asks), included where they are needed.
 *
 * One parsed state is shared by every thread (reference-counted, under a mutex), and parsed
 * again only when the file's text changes: a large state (8 GPUs x 1,000 processes) costs its
 * parse once per change, and threads that come and go leave nothing behind.
 */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define SIM_MAX_GPUS 64
#define SIM_TEXT 96          /* NVML's name and UUID buffers (..._V2_BUFFER_SIZE) */
#define SIM_DRIVER_TEXT 80   /* NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE */
#define SIM_DEFAULT_RESERVED (500ULL * 1024 * 1024) /* what an R510+ driver keeps back */
#define SIM_DEFAULT_NAME "NVIDIA H200 (simulated)"
#define SIM_DEFAULT_DRIVER "550.54.15"
#define SIM_NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFULL
#define SIM_MEMORY_V2_VERSION 0x02000028u
#define SIM_MAX_FAULTS 32
#define SIM_PROBLEM 256
#define SIM_STABLE_READS 50  /* tries to read the same text twice in a row */
#define SIM_QUIET_INCOMPLETE_S 2 /* an incomplete file is said only once it stays so */
/* A state file larger than this is refused: 8 GPUs x 1,000 processes take half a MiB. */
#define SIM_MAX_STATE_BYTES (16u << 20)
/* A file's mtime comes from the kernel's coarse clock (a tick: 1 to 10 ms): a state read less
 * than two ticks after its mtime could be rewritten, in place and at the same size, within the
 * same tick, so its unchanged stat proves nothing until its text is compared once more. Two
 * ticks as clock_getres tells them (racy_ns), at most this. */
#define SIM_RACY_NS 20000000LL

/* The calls a fault or a delay can target, in the state's (alphabetical) rendering order. */
enum { CALL_ANY, CALL_COUNT, CALL_DRIVER, CALL_INFO, CALL_INIT, CALL_MEMORY, CALL_NAME,
       CALL_PROCESSES, CALL_UUID, CALL_KINDS };
static const char *const sim_call_names[CALL_KINDS] = {
    "any", "count", "driver", "info", "init", "memory", "name", "processes", "uuid"};

/* A GPU's handle (mig -1), or one of its MIG instances' (mig: the GPU instance id). */
typedef struct { unsigned int index; int mig; } sim_device;
typedef sim_device *nvmlDevice_t;

#define SIM_MAX_GI 32         /* GPU instance ids run below this */
#define SIM_MAX_GI_PER_GPU 7  /* what an H100/H200 can hold */
#define SIM_MAX_MIGS 64
#define SIM_DEFAULT_MIG_NAME "NVIDIA H200 MIG (simulated)"

/* Handles are stable addresses, one per index (and instance), like NVML's own. */
static sim_device sim_handles[SIM_MAX_GPUS];
static sim_device sim_mig_handles[SIM_MAX_GPUS][SIM_MAX_GI];
static int sim_init_count;

typedef struct {
    unsigned long long total, used, free, reserved;
    int used_given, free_given, raw, name_hex, present, util_given, mig;
    unsigned int line, util;
    char uuid[SIM_TEXT];
    char name[SIM_TEXT];
} sim_gpu;

typedef struct {
    unsigned int gpu, pid, graphics, ends_with_exit, line;
    int mig; /* the GPU instance it runs in, -1: none */
    unsigned long long used;
    unsigned long long pidns; /* the PID namespace `pid` belongs to (its inode), 0: the caller's */
    unsigned long long start; /* when `pid` started (/proc/PID/stat field 22), if start_given */
    int start_given;
    int twin_before; /* an earlier line has this PID on this GPU (its other list) */
} sim_proc;

typedef struct {
    unsigned int gpu, gi, line;
    unsigned long long total;
    char uuid[SIM_TEXT];
    char name[SIM_TEXT];
} sim_mig;

typedef struct {
    int call; /* CALL_* */
    int error;
    int gpu;  /* -1: every GPU */
    unsigned int line;
} sim_fault;

/* What stat says of the file a state was read from: the same on a later stat (and the state
 * trusted, see SIM_RACY_NS), the file is unchanged and is not read again. */
typedef struct {
    dev_t dev;
    ino_t ino;
    off_t size;
    long long mtime_ns;
} sim_identity;

typedef struct {
    int refs;
    char *path, *text;
    size_t length;
    sim_identity seen; /* the file it was last read or compared from */
    int trusted;       /* that read settled its stat (read_settles) */
    int nodriver, unprivileged;
    unsigned int mig_count;
    sim_mig migs[SIM_MAX_MIGS];
    int slow_given[CALL_KINDS];
    unsigned int slow_ms[CALL_KINDS];
    unsigned int fault_count;
    sim_fault faults[SIM_MAX_FAULTS];
    unsigned int gpu_count;
    unsigned char lost[SIM_MAX_GPUS];
    unsigned int lost_line[SIM_MAX_GPUS];
    unsigned int proc_count, proc_capacity;
    sim_proc *procs;
    char driver[SIM_DRIVER_TEXT];
    sim_gpu gpus[SIM_MAX_GPUS];
    /* Each whole GPU's used bytes, worked out once per parse where no line's figure depends on
     * the moment (a line that ends when its process exits): a driver answers from memory. */
    unsigned long long used_known[SIM_MAX_GPUS];
    unsigned char used_fixed[SIM_MAX_GPUS];
    /* Each whole GPU's lines, in the file's order, found once per parse: a list call walks its
     * own GPU's (as a driver keeps a list a GPU), not the node's. GPU g's are
     * by_gpu[gpu_first[g]] to by_gpu[gpu_first[g + 1] - 1]; NULL: walk them all. */
    unsigned int *by_gpu;
    unsigned int gpu_first[SIM_MAX_GPUS + 1];
} sim_state;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

#include "nvml_state.c"

/* ------------------------------------------------------------------------------------------ */
/* Calls.                                                                                     */

/* Whether process PID runs: it exists and has not exited (a zombie's GPU memory is already
 * freed, as the driver tears a context down at exit, before the parent reaps it), and, when
 * START is given, it is the process that started then (field 22 of /proc/PID/stat, ticks since
 * boot), not a later one that reused the PID. The same rule as jax_nbmem/simgpu/liveness.py. */
static int process_running(unsigned int pid, int start_given, unsigned long long start) {
    char path[64], stat[1024];
    const char *end, *field;
    unsigned long long started;
    int number;
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    FILE *file = fopen(path, "r");
    if (file == NULL) {
        /* EPERM means it exists (another user's): only "no such process" says it ended. */
        return !(kill((pid_t)pid, 0) != 0 && errno == ESRCH);
    }
    size_t got = fread(stat, 1, sizeof stat - 1, file);
    fclose(file);
    stat[got] = '\0';
    end = strrchr(stat, ')');
    if (end == NULL) return 1;
    if (!(end[1] == ' ' && end[2] != 'Z' && end[2] != 'X')) return 0;
    if (!start_given) return 1;
    /* Fields after the command name: the state is field 3, the start field 22. */
    field = end + 2;
    for (number = 3; number < 22 && field; number++) {
        field = strchr(field, ' ');
        if (field) field++;
    }
    if (!field || !isdigit((unsigned char)*field)) return 1; /* unreadable: it runs */
    started = strtoull(field, NULL, 10);
    return started == start;
}

/* Whether a listed process has ended, as far as this caller can tell. A line of the registrar
 * (`pidns=`) names a PID of that namespace: a caller in another (a container) cannot test it
 * and leaves it to the registrar, which removes the line when the process ends. */
static unsigned long long own_pid_namespace(void) {
    /* A process's PID namespace never changes; a forked child (maybe in a new one) looks again. */
    static unsigned long long cached;
    static pid_t cached_for;
    struct stat own;
    pid_t pid = getpid();
    if (cached_for != pid) {
        cached = stat("/proc/self/ns/pid", &own) == 0 ? (unsigned long long)own.st_ino : 0;
        cached_for = pid;
    }
    return cached;
}

static int proc_gone(const sim_proc *proc) {
    if (!proc->ends_with_exit) return 0;
    if (proc->pidns && proc->pidns != own_pid_namespace()) return 0;
    return !process_running(proc->pid, proc->start_given, proc->start);
}

/* Takes off a parsed state the lines of processes that ended for this caller (proc_gone). */
static void keep_live_lines(sim_state *state) {
    unsigned int i, kept = 0;
    for (i = 0; i < state->proc_count; i++) {
        if (!proc_gone(&state->procs[i])) state->procs[kept++] = state->procs[i];
    }
    state->proc_count = kept;
    free(state->by_gpu); /* the lines moved: walk them all */
    state->by_gpu = NULL;
}

/* Not NVML: parses TEXT as jaxNbmemSimCheck does, and renders in OUT the state less the lines
 * of processes that ended for this caller: 0, or 1 and the problem. The tests hand the same
 * lines to SimState.forget_ended() and compare: one rule on both sides. */
API int jaxNbmemSimLive(const char *text, char *out, unsigned int length) {
    return render_checked(text, out, length, keep_live_lines);
}

/* Waits as long as the state says CALL is slow (a hung or overloaded driver). */
static void sim_wait(const sim_state *state, int call) {
    unsigned int ms = state->slow_given[call] ? state->slow_ms[call]
                      : state->slow_given[CALL_ANY] ? state->slow_ms[CALL_ANY] : 0;
    struct timespec pause;
    if (!ms) return;
    pause.tv_sec = ms / 1000;
    pause.tv_nsec = (long)(ms % 1000) * 1000000L;
    while (nanosleep(&pause, &pause) != 0) {
    }
}

/* The error CALL returns on GPU `gpu` (-1: not a device call), or NVML_SUCCESS. */
static nvmlReturn_t sim_fault_for(const sim_state *state, int call, int gpu) {
    unsigned int i;
    for (i = 0; i < state->fault_count; i++) {
        const sim_fault *fault = &state->faults[i];
        if ((fault->call == CALL_ANY || fault->call == call) &&
            (fault->gpu == -1 || fault->gpu == gpu))
            return fault->error;
    }
    return NVML_SUCCESS;
}

/* Waits if CALL is slow, then says whether it must fail; releases the state when it does. */
static nvmlReturn_t sim_enter(sim_state **state, int call, int gpu) {
    nvmlReturn_t fault;
    sim_wait(*state, call);
    fault = sim_fault_for(*state, call, gpu);
    if (fault != NVML_SUCCESS) {
        release_state(*state);
        *state = NULL;
    }
    return fault;
}

/* Loads the state for a call that needs an initialized library. */
static sim_state *begin_call(nvmlReturn_t *ret) {
    if (__atomic_load_n(&sim_init_count, __ATOMIC_SEQ_CST) <= 0) {
        *ret = NVML_ERROR_UNINITIALIZED;
        return NULL;
    }
    return load_state(ret);
}

/* Loads the state and finds the device behind a handle, checking that it is still there. */
static int is_handle(nvmlDevice_t device) {
    const sim_device *first = &sim_mig_handles[0][0];
    return (device >= sim_handles && device < sim_handles + SIM_MAX_GPUS) ||
           (device >= first && device < first + SIM_MAX_GPUS * SIM_MAX_GI);
}

/* Loads the state and finds the GPU behind a handle (a MIG instance's: its GPU's), checking
 * that it (and the instance) is still there. */
static sim_gpu *begin_device_call(nvmlDevice_t device, sim_state **state, nvmlReturn_t *ret) {
    *state = begin_call(ret);
    if (!*state) return NULL;
    if (!is_handle(device) || !(*state)->gpus[device->index].present ||
        (device->mig >= 0 && (!(*state)->gpus[device->index].mig ||
                              !find_mig(*state, device->index, device->mig)))) {
        *ret = NVML_ERROR_INVALID_ARGUMENT;
    } else if ((*state)->lost[device->index]) {
        *ret = NVML_ERROR_GPU_IS_LOST;
    } else {
        return &(*state)->gpus[device->index];
    }
    release_state(*state);
    *state = NULL;
    return NULL;
}

/* The device's used memory (v2 `used`): what its running processes hold, each once, their
 * CUDA contexts inside their figures, as R510+ drivers count it; `used=` pins it. */
static unsigned long long device_used(const sim_state *state, unsigned int index, int mig) {
    const sim_gpu *gpu = &state->gpus[index];
    unsigned long long used = 0;
    unsigned int i, j;
    if (gpu->used_given) return gpu->raw || gpu->used <= gpu->total ? gpu->used : gpu->total;
    if (mig < 0 && state->used_fixed[index]) return state->used_known[index];
    for (i = 0; i < state->proc_count; i++) {
        const sim_proc *proc = &state->procs[i];
        if (proc->gpu != index || proc->used == SIM_NOT_AVAILABLE) continue;
        if (mig >= 0 && proc->mig != mig) continue;
        if (proc_gone(proc)) continue;
        /* A process on both the compute and the graphics list holds its memory once (an ended
         * line of a reused PID holds nothing, and hides nothing). Only a line with a twin
         * before it is looked back for: the parse marked them, so 1,000 lines are not 500,000
         * comparisons a call. */
        if (!proc->twin_before) {
            used += proc->used;
            continue;
        }
        for (j = 0; j < i; j++) {
            if (state->procs[j].gpu == index && state->procs[j].pid == proc->pid &&
                !proc_gone(&state->procs[j]))
                break;
        }
        if (j == i) used += proc->used;
    }
    return used > gpu->total ? gpu->total : used;
}

static nvmlReturn_t copy_string(char *dest, unsigned int length, const char *src) {
    if (!dest) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dest, src);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    nvmlReturn_t ret;
    sim_state *state = load_state(&ret);
    (void)flags;
    if (!state) return ret;
    if ((ret = sim_enter(&state, CALL_INIT, -1)) != NVML_SUCCESS) return ret;
    /* Without a GPU the kernel module does not load, and NVML cannot start. */
    ret = state->gpu_count ? NVML_SUCCESS : NVML_ERROR_DRIVER_NOT_LOADED;
    release_state(state);
    if (ret == NVML_SUCCESS) __atomic_add_fetch(&sim_init_count, 1, __ATOMIC_SEQ_CST);
    return ret;
}

API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
API nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

API nvmlReturn_t nvmlShutdown(void) {
    int count = __atomic_load_n(&sim_init_count, __ATOMIC_SEQ_CST);
    while (count > 0) {
        if (__atomic_compare_exchange_n(&sim_init_count, &count, count - 1, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST))
            return NVML_SUCCESS;
    }
    return NVML_ERROR_UNINITIALIZED;
}

/* The texts of NVIDIA's libnvidia-ml, and where each was checked (2026-12):
 *  - 0-20, 23 and 999: as NVIDIA's DCGM spells them in its own table of the driver's texts
 *    (dcgmlib nvml_error_strings.h); 3, 9, 15 and 999 also as pynvml printed them from real
 *    drivers in user reports, 16 in a k8s log ("failed to get nvlink state: GPU requires
 *    reset"), 17 in nvidia-smi -q output (gVisor PR 10676) and 18 in nvidia-smi's own
 *    "Failed to initialize NVML: Driver/library version mismatch".
 *  - 25: quoted from a real driver through go-nvml, whose Return.Error() is the library's
 *    nvmlErrorString (go-nvml issue 138; leptonai/gpud notes the same text).
 *  - 27: quoted from a real driver on an H100 PCIe (pynvml issue 54, codecarbon issue 578) and
 *    in gpud's log "nvml.CLOCK_GRAPHICS: System is not in ready state".
 *  - 21, 22, 24, 26, 28 and 29 are NOT verified: no text quoted from a real driver was found;
 *    these follow nvml.h's description of each code. */
API const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
        case 0: return "Success";
        case 1: return "Uninitialized";
        case 2: return "Invalid Argument";
        case 3: return "Not Supported";
        case 4: return "Insufficient Permissions";
        case 5: return "Already Initialized";
        case 6: return "Not Found";
        case 7: return "Insufficient Size";
        case 8: return "Insufficient External Power";
        case 9: return "Driver Not Loaded";
        case 10: return "Timeout";
        case 11: return "Interrupt Request Issue";
        case 12: return "NVML Shared Library Not Found";
        case 13: return "Function Not Found";
        case 14: return "Corrupted infoROM";
        case 15: return "GPU is lost";
        case 16: return "GPU requires reset";
        case 17: return "GPU access blocked by the operating system";
        case 18: return "Driver/library version mismatch";
        case 19: return "In use by another client";
        case 20: return "Insufficient Memory";
        case 21: return "No data"; /* not verified */
        case 22: return "The requested vgpu operation is not available on target device, "
                        "because ECC is enabled"; /* not verified */
        case 23: return "Insufficient Resources";
        case 24: return "Ran out of critical resources, other than memory"; /* not verified */
        case 25: return "Argument version mismatch";
        case 26: return "The requested functionality has been deprecated"; /* not verified */
        case 27: return "System is not in ready state";
        case 28: return "The GPU is not found"; /* not verified */
        case 29: return "Invalid state"; /* not verified */
        default: return "Unknown Error";
    }
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t ret;
    sim_state *state = begin_call(&ret);
    if (!state) return ret;
    if ((ret = sim_enter(&state, CALL_DRIVER, -1)) != NVML_SUCCESS) return ret;
    ret = copy_string(version, length, state->driver);
    release_state(state);
    return ret;
}

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    nvmlReturn_t ret;
    sim_state *state = begin_call(&ret);
    if (!state) return ret;
    if ((ret = sim_enter(&state, CALL_COUNT, -1)) != NVML_SUCCESS) return ret;
    if (!count) ret = NVML_ERROR_INVALID_ARGUMENT;
    else *count = state->gpu_count;
    release_state(state);
    return ret;
}

API nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    nvmlReturn_t ret;
    sim_state *state = begin_call(&ret);
    if (!state) return ret;
    if (!device || index >= SIM_MAX_GPUS || !state->gpus[index].present) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
    } else if (state->lost[index]) {
        ret = NVML_ERROR_GPU_IS_LOST;
    } else {
        sim_handles[index].index = index;
        sim_handles[index].mig = -1;
        *device = &sim_handles[index];
    }
    release_state(state);
    return ret;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    nvmlReturn_t ret;
    sim_state *state;
    if (!begin_device_call(device, &state, &ret)) return ret;
    if (!index) ret = NVML_ERROR_INVALID_ARGUMENT;
    else *index = device->index;
    release_state(state);
    return ret;
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    nvmlReturn_t ret;
    sim_state *state;
    sim_gpu *gpu = begin_device_call(device, &state, &ret);
    if (!gpu) return ret;
    if ((ret = sim_enter(&state, CALL_UUID, (int)device->index)) != NVML_SUCCESS) return ret;
    ret = copy_string(uuid, length, device->mig >= 0
                                        ? find_mig(state, device->index, device->mig)->uuid
                                        : gpu->uuid);
    release_state(state);
    return ret;
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    nvmlReturn_t ret;
    sim_state *state;
    sim_gpu *gpu = begin_device_call(device, &state, &ret);
    if (!gpu) return ret;
    if ((ret = sim_enter(&state, CALL_NAME, (int)device->index)) != NVML_SUCCESS) return ret;
    ret = copy_string(name, length, device->mig >= 0
                                        ? find_mig(state, device->index, device->mig)->name
                                        : gpu->name);
    release_state(state);
    return ret;
}

/* On a GPU in MIG mode, a user other than root may not ask the GPU itself (only its
 * instances) for memory or processes, as real drivers refuse. */
static int parent_refused(const sim_state *state, const sim_gpu *gpu, nvmlDevice_t device) {
    return gpu->mig && device->mig < 0 && (state->unprivileged || geteuid() != 0);
}

/* Version 1 counts the driver's reserved memory as used, as drivers do. */
API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    nvmlReturn_t ret;
    sim_state *state;
    sim_gpu *gpu = begin_device_call(device, &state, &ret);
    if (!gpu) return ret;
    if ((ret = sim_enter(&state, CALL_MEMORY, (int)device->index)) != NVML_SUCCESS) return ret;
    if (!memory) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
    } else if (parent_refused(state, gpu, device)) {
        ret = NVML_ERROR_NO_PERMISSION;
    } else if (device->mig >= 0) {
        const sim_mig *mig = find_mig(state, device->index, device->mig);
        unsigned long long used = device_used(state, device->index, device->mig);
        memory->total = mig->total;
        memory->used = used > mig->total ? mig->total : used;
        memory->free = mig->total - memory->used;
    } else if (gpu->raw) {
        memory->total = gpu->total;
        memory->used = device_used(state, device->index, -1);
        memory->free = gpu->free_given ? gpu->free : gpu->total - memory->used;
    } else {
        unsigned long long used = device_used(state, device->index, -1) + gpu->reserved;
        if (used > gpu->total) used = gpu->total;
        memory->total = gpu->total;
        memory->used = used;
        memory->free = gpu->total - used;
    }
    release_state(state);
    return ret;
}

#ifndef SIM_OLD_DRIVER
API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    nvmlReturn_t ret;
    sim_state *state;
    sim_gpu *gpu = begin_device_call(device, &state, &ret);
    if (!gpu) return ret;
    if ((ret = sim_enter(&state, CALL_MEMORY, (int)device->index)) != NVML_SUCCESS) return ret;
    if (!memory) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
    } else if (memory->version != SIM_MEMORY_V2_VERSION) {
        ret = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    } else if (parent_refused(state, gpu, device)) {
        ret = NVML_ERROR_NO_PERMISSION;
    } else if (device->mig >= 0) {
        const sim_mig *mig = find_mig(state, device->index, device->mig);
        unsigned long long used = device_used(state, device->index, device->mig);
        memory->total = mig->total;
        memory->reserved = 0;
        memory->used = used > mig->total ? mig->total : used;
        memory->free = mig->total - memory->used;
    } else if (gpu->raw) {
        memory->total = gpu->total;
        memory->reserved = gpu->reserved;
        memory->used = device_used(state, device->index, -1);
        memory->free = gpu->free_given ? gpu->free : gpu->total - memory->used - gpu->reserved;
    } else {
        unsigned long long reserved = gpu->reserved > gpu->total ? gpu->total : gpu->reserved;
        unsigned long long used = device_used(state, device->index, -1);
        if (used > gpu->total - reserved) used = gpu->total - reserved;
        memory->total = gpu->total;
        memory->reserved = reserved;
        memory->used = used;
        memory->free = gpu->total - reserved - used;
    }
    release_state(state);
    return ret;
}
#endif

/* The lines of GPU `gpu` (indices into state->procs, *count of them), or NULL and every line
 * (*count = proc_count) where the state has no index: the caller still checks each line. */
static const unsigned int *gpu_lines(const sim_state *state, unsigned int gpu, unsigned int *count) {
    if (!state->by_gpu || gpu >= SIM_MAX_GPUS) {
        *count = state->proc_count;
        return NULL;
    }
    *count = state->gpu_first[gpu + 1] - state->gpu_first[gpu];
    return state->by_gpu + state->gpu_first[gpu];
}

/* NVML's two-call protocol: a short (or NULL) array gets INSUFFICIENT_SIZE and the count.
 * `size` is the caller's struct: v1 (pid, bytes) or later (with the instance ids). */
static nvmlReturn_t list_processes(nvmlDevice_t device, unsigned int *count, void *infos,
                                   unsigned int graphics, size_t size) {
    nvmlReturn_t ret;
    sim_state *state;
    unsigned int i, found = 0, line_count;
    const unsigned int *lines;
    if (!begin_device_call(device, &state, &ret)) return ret;
    if ((ret = sim_enter(&state, CALL_PROCESSES, (int)device->index)) != NVML_SUCCESS) {
        /* A persistent INSUFFICIENT_SIZE, as when processes come and go between the calls. */
        if (ret == NVML_ERROR_INSUFFICIENT_SIZE && count) *count = *count + 1;
        return ret;
    }
    if (!count) {
        release_state(state);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (parent_refused(state, &state->gpus[device->index], device)) {
        release_state(state);
        return NVML_ERROR_NO_PERMISSION;
    }
    lines = gpu_lines(state, device->index, &line_count);
    for (i = 0; i < line_count; i++) {
        const sim_proc *proc = &state->procs[lines ? lines[i] : i];
        if (proc->gpu != device->index || proc->graphics != graphics) continue;
        if (device->mig >= 0 && proc->mig != device->mig) continue;
        if (proc_gone(proc)) continue;
        found++;
    }
    if (found > *count || (found > 0 && !infos)) {
        *count = found;
        release_state(state);
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = found;
    found = 0;
    for (i = 0; i < line_count && found < *count; i++) {
        const sim_proc *proc = &state->procs[lines ? lines[i] : i];
        if (proc->gpu != device->index || proc->graphics != graphics) continue;
        if (device->mig >= 0 && proc->mig != device->mig) continue;
        if (proc_gone(proc)) continue;
        if (size == sizeof(nvmlProcessInfo_v1_t)) {
            nvmlProcessInfo_v1_t *info = (nvmlProcessInfo_v1_t *)infos + found;
            info->pid = proc->pid;
            info->usedGpuMemory = proc->used;
        } else {
            nvmlProcessInfo_t *info = (nvmlProcessInfo_t *)infos + found;
            info->pid = proc->pid;
            info->usedGpuMemory = proc->used;
            /* In MIG mode each process runs in an instance (one compute instance, id 0). */
            info->gpuInstanceId = proc->mig >= 0 ? (unsigned int)proc->mig : 0xFFFFFFFFu;
            info->computeInstanceId = proc->mig >= 0 ? 0u : 0xFFFFFFFFu;
        }
        found++; /* one more may have started between the two loops: it is left out */
    }
    *count = found; /* one may have exited between the two loops */
    release_state(state);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                      nvmlProcessInfo_v1_t *infos) {
    return list_processes(device, count, infos, 0, sizeof *infos);
}

API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                       nvmlProcessInfo_v1_t *infos) {
    return list_processes(device, count, infos, 1, sizeof *infos);
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                         nvmlProcessInfo_t *infos) {
    return list_processes(device, count, infos, 0, sizeof *infos);
}

API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device,
                                                          unsigned int *count,
                                                          nvmlProcessInfo_t *infos) {
    return list_processes(device, count, infos, 1, sizeof *infos);
}

#ifndef SIM_OLD_DRIVER
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                         nvmlProcessInfo_t *infos) {
    return list_processes(device, count, infos, 0, sizeof *infos);
}

API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                          unsigned int *count,
                                                          nvmlProcessInfo_t *infos) {
    return list_processes(device, count, infos, 1, sizeof *infos);
}
#endif

#include "nvml_clients.c"
#include "nvml_query.c"
