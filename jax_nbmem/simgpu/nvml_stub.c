/*
 * A simulated libnvidia-ml.so.1 for jax_nbmem's tests and no-GPU demo.
 *
 * It answers the handful of NVML calls that jax_nbmem.nvml makes (through the real pynvml)
 * from a small text "state file" named by $JAX_NBMEM_SIMGPU_STATE. The file is read again
 * on every call, and the variable is looked up on every call, so another process (or Python
 * code changing os.environ) can change what the "GPU" reports at any time. Writers replace the
 * file atomically, so a reader sees either the old or the new state, never half of one.
 *
 * Line format (see jax_nbmem/simgpu/simulator.py, which writes it):
 *   driver VERSION
 *   gpu INDEX UUID total=BYTES [used=BYTES] [free=BYTES] [reserved=BYTES] [raw]
 *       [namehex=HEX] [name=REST OF LINE]
 *   proc GPU PID used=BYTES|na [kind=compute|graphics] [ends=exit]
 *       (ends=exit: listed only while process PID exists, as the driver drops a process that
 *       exited; the demo's kernels write themselves so, and may be killed without a goodbye)
 *   lost GPU
 *   nodriver
 *   slow CALL MILLISECONDS         every CALL waits that long before it answers
 *   fail CALL ERROR [GPU]          every CALL (on GPU, or on all) returns NVML error ERROR
 * CALL is one of init, count, name, uuid, memory, processes, driver, or any. A gpu line with
 * `raw` reports total, used and free exactly as given (no clamping), to simulate a driver that
 * returns nonsense; `namehex=` gives the name as raw bytes (not necessarily UTF-8).
 * Lines starting with '#' and anything after whitespace + '#' are comments.
 *
 * Functions that are not defined here are simply not exported; pynvml then raises
 * NVMLError_FunctionNotFound, exactly as with an old driver. Building with -DSIM_OLD_DRIVER
 * leaves out nvmlDeviceGetMemoryInfo_v2 and the _v3 process lists for that reason.
 *
 * Each thread parses the file into a buffer of its own, again only when the file changed, so
 * concurrent callers share nothing but the init refcount (an atomic), and a large state (8
 * GPUs x 1,000 processes) costs its parse once per change rather than once per call.
 */
#include <ctype.h>
#include <stdio.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define SIM_MAX_GPUS 64
#define SIM_MAX_PROCS 16384
#define SIM_TEXT 96
/* Memory a real device shows as used with no process on it (driver, contexts). */
#define SIM_BASE_USED (500ULL * 1024 * 1024)
#define SIM_NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFULL
#define SIM_MEMORY_V2_VERSION 0x02000028u
#define SIM_MAX_FAULTS 32

enum { CALL_INIT, CALL_COUNT, CALL_NAME, CALL_UUID, CALL_MEMORY, CALL_PROCESSES, CALL_DRIVER,
       CALL_KINDS };
static const char *const sim_call_names[CALL_KINDS] = {
    "init", "count", "name", "uuid", "memory", "processes", "driver"};

typedef struct { unsigned int index; } sim_device;
typedef sim_device *nvmlDevice_t;

/* Handles are stable addresses, one per index, like NVML's own. */
static sim_device sim_handles[SIM_MAX_GPUS];
static int sim_init_count;

typedef struct {
    unsigned long long total, used, free, reserved;
    int used_given, free_given, raw, present;
    char uuid[SIM_TEXT];
    char name[SIM_TEXT];
} sim_gpu;

typedef struct {
    unsigned int gpu, pid, graphics, ends_with_exit;
    unsigned long long used;
} sim_proc;

typedef struct {
    int call; /* CALL_*, or -1 for any */
    int error;
    int gpu;  /* -1: every GPU */
} sim_fault;

typedef struct {
    int nodriver;
    unsigned int slow_ms[CALL_KINDS];
    unsigned int fault_count;
    sim_fault faults[SIM_MAX_FAULTS];
    unsigned int gpu_count;
    unsigned char lost[SIM_MAX_GPUS];
    unsigned int proc_count;
    char driver[SIM_TEXT];
    sim_gpu gpus[SIM_MAX_GPUS];
    sim_proc procs[SIM_MAX_PROCS];
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

static void copy_text(char *dest, const char *src) {
    size_t length = strlen(src);
    if (length >= SIM_TEXT) length = SIM_TEXT - 1;
    memcpy(dest, src, length);
    dest[length] = '\0';
}

static void strip_comment_and_newline(char *line) {
    char *p;
    line[strcspn(line, "\r\n")] = '\0';
    for (p = line; *p; p++) {
        if (*p == '#' && (p == line || isspace((unsigned char)p[-1]))) {
            *p = '\0';
            break;
        }
    }
}

/* Reads "key=value" options after the fixed fields; name= takes the rest of the line. */
static void parse_gpu_options(sim_gpu *gpu, char *rest) {
    char *token;
    char *name = strstr(rest, "name=");
    if (name && (name == rest || isspace((unsigned char)name[-1]))) {
        char *end;
        copy_text(gpu->name, name + 5);
        end = gpu->name + strlen(gpu->name);
        while (end > gpu->name && isspace((unsigned char)end[-1])) *--end = '\0';
        *name = '\0';
    }
    for (token = strtok(rest, " \t"); token; token = strtok(NULL, " \t")) {
        if (strncmp(token, "total=", 6) == 0) {
            gpu->total = strtoull(token + 6, NULL, 10);
        } else if (strncmp(token, "used=", 5) == 0) {
            gpu->used = strtoull(token + 5, NULL, 10);
            gpu->used_given = 1;
        } else if (strncmp(token, "free=", 5) == 0) {
            gpu->free = strtoull(token + 5, NULL, 10);
            gpu->free_given = 1;
        } else if (strncmp(token, "reserved=", 9) == 0) {
            gpu->reserved = strtoull(token + 9, NULL, 10);
        } else if (strcmp(token, "raw") == 0) {
            gpu->raw = 1;
        } else if (strncmp(token, "namehex=", 8) == 0) {
            const char *hex = token + 8;
            size_t i, n = strlen(hex) / 2;
            if (n >= SIM_TEXT) n = SIM_TEXT - 1;
            for (i = 0; i < n; i++) {
                char pair[3] = {hex[2 * i], hex[2 * i + 1], 0};
                gpu->name[i] = (char)strtoul(pair, NULL, 16);
            }
            gpu->name[n] = '\0';
        }
    }
}

static int call_kind(const char *word) {
    int i;
    if (strcmp(word, "any") == 0) return -1;
    for (i = 0; i < CALL_KINDS; i++) {
        if (strcmp(word, sim_call_names[i]) == 0) return i;
    }
    return -2;
}

/* Whether process PID runs: it exists and has not exited (a zombie's GPU memory is already
 * freed, as the driver tears a context down at exit, before the parent reaps it). */
static int process_running(unsigned int pid) {
    char path[64], stat[512];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    FILE *file = fopen(path, "r");
    if (file == NULL) {
        /* EPERM means it exists (another user's): only "no such process" says it ended. */
        return !(kill((pid_t)pid, 0) != 0 && errno == ESRCH);
    }
    size_t got = fread(stat, 1, sizeof stat - 1, file);
    fclose(file);
    stat[got] = '\0';
    const char *end = strrchr(stat, ')');
    return end == NULL || (end[1] == ' ' && end[2] != 'Z' && end[2] != 'X');
}

static void parse_line(sim_state *state, char *line) {
    char word[16], text[SIM_TEXT];
    unsigned int index, pid;
    int consumed = 0;

    strip_comment_and_newline(line);
    if (sscanf(line, "%15s%n", word, &consumed) != 1) return;
    if (strcmp(word, "nodriver") == 0) {
        state->nodriver = 1;
    } else if (strcmp(word, "driver") == 0) {
        if (sscanf(line + consumed, "%95s", text) == 1) copy_text(state->driver, text);
    } else if (strcmp(word, "gpu") == 0) {
        if (sscanf(line, "gpu %u %95s %n", &index, text, &consumed) < 2) return;
        if (index >= SIM_MAX_GPUS) return;
        sim_gpu *gpu = &state->gpus[index];
        memset(gpu, 0, sizeof *gpu);
        gpu->present = 1;
        copy_text(gpu->uuid, text);
        copy_text(gpu->name, "NVIDIA GPU (simulated)");
        parse_gpu_options(gpu, line + consumed);
    } else if (strcmp(word, "proc") == 0) {
        char used[32] = "", kind[32] = "", ends[32] = "";
        if (state->proc_count >= SIM_MAX_PROCS) return;
        if (sscanf(line, "proc %u %u used=%31s kind=%31s ends=%31s", &index, &pid, used, kind,
                   ends) < 3)
            return;
        sim_proc *proc = &state->procs[state->proc_count++];
        /* Checked at each call, not here: the parsed state is kept while the file is unchanged. */
        proc->ends_with_exit = strcmp(ends, "exit") == 0;
        proc->gpu = index;
        proc->pid = pid;
        proc->graphics = strcmp(kind, "graphics") == 0;
        proc->used = strcmp(used, "na") == 0 ? SIM_NOT_AVAILABLE : strtoull(used, NULL, 10);
    } else if (strcmp(word, "slow") == 0) {
        unsigned int ms;
        int kind, i;
        if (sscanf(line + consumed, "%15s %u", text, &ms) != 2) return;
        if ((kind = call_kind(text)) == -2) return;
        for (i = 0; i < CALL_KINDS; i++) {
            if (kind == -1 || kind == i) state->slow_ms[i] = ms;
        }
    } else if (strcmp(word, "fail") == 0) {
        int error, gpu = -1, kind, fields;
        if (state->fault_count >= SIM_MAX_FAULTS) return;
        fields = sscanf(line + consumed, "%15s %d %d", text, &error, &gpu);
        if (fields < 2 || (kind = call_kind(text)) == -2) return;
        state->faults[state->fault_count].call = kind;
        state->faults[state->fault_count].error = error;
        state->faults[state->fault_count].gpu = fields == 3 ? gpu : -1;
        state->fault_count++;
    } else if (strcmp(word, "lost") == 0) {
        if (sscanf(line + consumed, "%u", &index) == 1 && index < SIM_MAX_GPUS)
            state->lost[index] = 1;
    }
}

/* Each thread keeps the state it parsed last, with the text it parsed it from, and parses
 * again only when the file's text differs (file times are too coarse to tell two quick writes
 * apart). Per thread, so that concurrent callers share nothing; a call never frees what it
 * got. Reading and comparing the text costs little; parsing it is what a large state costs. */
typedef struct {
    char *text;
    size_t length;
    sim_state *state;
} sim_cache;

static __thread sim_cache sim_cached;

/* The whole file, in a buffer of its own (NULL when it cannot be read). */
static char *read_text(FILE *file, size_t *length) {
    size_t capacity = 1 << 16, used = 0, got;
    char *text = malloc(capacity + 1);
    while (text && (got = fread(text + used, 1, capacity - used, file)) > 0) {
        used += got;
        if (used == capacity) {
            char *larger = realloc(text, capacity * 2 + 1);
            if (!larger) {
                free(text);
                return NULL;
            }
            text = larger;
            capacity *= 2;
        }
    }
    if (text) text[used] = '\0';
    *length = used;
    return text;
}

/* Loads the state named by the environment; NULL with *ret set when there is no "driver". */
static sim_state *load_state(nvmlReturn_t *ret) {
    const char *path = getenv("JAX_NBMEM_SIMGPU_STATE");
    sim_cache *cache = &sim_cached;
    size_t length = 0;
    unsigned int i;
    char *text, *line, *next;
    FILE *file;

    if (!path || !*path || !(file = fopen(path, "r"))) {
        *ret = NVML_ERROR_DRIVER_NOT_LOADED;
        return NULL;
    }
    text = read_text(file, &length);
    fclose(file);
    if (!text) {
        *ret = NVML_ERROR_MEMORY;
        return NULL;
    }
    if (cache->state && cache->text && cache->length == length &&
        memcmp(cache->text, text, length) == 0) {
        free(text);
    } else {
        if (!cache->state && !(cache->state = malloc(sizeof *cache->state))) {
            free(text);
            *ret = NVML_ERROR_MEMORY;
            return NULL;
        }
        free(cache->text);
        cache->text = text;
        cache->length = length;
        memset(cache->state, 0, sizeof *cache->state);
        copy_text(cache->state->driver, "simulated");
        text = malloc(length + 1); /* parse_line writes into its line: parse a copy */
        if (!text) {
            free(cache->text);
            cache->text = NULL;
            *ret = NVML_ERROR_MEMORY;
            return NULL;
        }
        memcpy(text, cache->text, length + 1);
        for (line = text; line && *line; line = next) {
            next = strchr(line, '\n');
            if (next) *next++ = '\0';
            parse_line(cache->state, line);
        }
        free(text);
        for (i = 0; i < SIM_MAX_GPUS; i++) cache->state->gpu_count += cache->state->gpus[i].present;
    }
    if (cache->state->nodriver) {
        *ret = NVML_ERROR_DRIVER_NOT_LOADED;
        return NULL;
    }
    *ret = NVML_SUCCESS;
    return cache->state;
}

/* The counterpart of load_state: the state stays cached for this thread's next call. */
static void release_state(sim_state *state) { (void)state; }

/* Waits as long as the state says CALL is slow (a hung or overloaded driver). */
static void sim_wait(const sim_state *state, int call) {
    unsigned int ms = state->slow_ms[call];
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
        if ((fault->call == -1 || fault->call == call) && (fault->gpu == -1 || fault->gpu == gpu))
            return fault->error;
    }
    return NVML_SUCCESS;
}

/* Waits if CALL is slow, then says whether it must fail; frees the state when it does. */
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
static sim_gpu *begin_device_call(nvmlDevice_t device, sim_state **state, nvmlReturn_t *ret) {
    *state = begin_call(ret);
    if (!*state) return NULL;
    if (device < sim_handles || device >= sim_handles + SIM_MAX_GPUS ||
        !(*state)->gpus[device->index].present) {
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

static unsigned long long device_used(const sim_state *state, unsigned int index) {
    const sim_gpu *gpu = &state->gpus[index];
    unsigned long long used = SIM_BASE_USED;
    unsigned int i, j;
    if (gpu->used_given) return gpu->raw || gpu->used <= gpu->total ? gpu->used : gpu->total;
    for (i = 0; i < state->proc_count; i++) {
        const sim_proc *proc = &state->procs[i];
        if (proc->gpu != index || proc->used == SIM_NOT_AVAILABLE) continue;
        if (proc->ends_with_exit && !process_running(proc->pid)) continue;
        /* A process on both the compute and the graphics list holds its memory once. */
        for (j = 0; j < i; j++) {
            if (state->procs[j].gpu == index && state->procs[j].pid == proc->pid) break;
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
    release_state(state);
    __atomic_add_fetch(&sim_init_count, 1, __ATOMIC_SEQ_CST);
    return NVML_SUCCESS;
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

API const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
        case NVML_SUCCESS: return "Success";
        case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
        case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
        case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
        case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
        case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
        case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
        case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
        case NVML_ERROR_MEMORY: return "Insufficient Memory";
        case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
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
        *device = &sim_handles[index];
    }
    release_state(state);
    return ret;
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
    ret = copy_string(uuid, length, gpu->uuid);
    release_state(state);
    return ret;
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    nvmlReturn_t ret;
    sim_state *state;
    sim_gpu *gpu = begin_device_call(device, &state, &ret);
    if (!gpu) return ret;
    if ((ret = sim_enter(&state, CALL_NAME, (int)device->index)) != NVML_SUCCESS) return ret;
    ret = copy_string(name, length, gpu->name);
    release_state(state);
    return ret;
}

/* Version 1 reports the driver's reserved memory as part of "used", like old drivers did. */
API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    nvmlReturn_t ret;
    sim_state *state;
    sim_gpu *gpu = begin_device_call(device, &state, &ret);
    if (!gpu) return ret;
    if ((ret = sim_enter(&state, CALL_MEMORY, (int)device->index)) != NVML_SUCCESS) return ret;
    if (!memory) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
    } else if (gpu->raw) {
        memory->total = gpu->total;
        memory->used = device_used(state, device->index);
        memory->free = gpu->free_given ? gpu->free : gpu->total - memory->used;
    } else {
        unsigned long long used = device_used(state, device->index) + gpu->reserved;
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
    } else if (gpu->raw) {
        memory->total = gpu->total;
        memory->reserved = gpu->reserved;
        memory->used = device_used(state, device->index);
        memory->free = gpu->free_given ? gpu->free : gpu->total - memory->used - gpu->reserved;
    } else {
        unsigned long long reserved = gpu->reserved > gpu->total ? gpu->total : gpu->reserved;
        unsigned long long used = device_used(state, device->index);
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

/* NVML's two-call protocol: a short (or NULL) array gets INSUFFICIENT_SIZE and the count. */
static nvmlReturn_t list_processes(nvmlDevice_t device, unsigned int *count,
                                   nvmlProcessInfo_t *infos, unsigned int graphics) {
    nvmlReturn_t ret;
    sim_state *state;
    unsigned int i, found = 0;
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
    for (i = 0; i < state->proc_count; i++) {
        const sim_proc *proc = &state->procs[i];
        if (proc->gpu != device->index || proc->graphics != graphics) continue;
        if (proc->ends_with_exit && !process_running(proc->pid)) continue;
        found++;
    }
    if (found > *count || (found > 0 && !infos)) {
        *count = found;
        release_state(state);
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = found;
    found = 0;
    for (i = 0; i < state->proc_count; i++) {
        const sim_proc *proc = &state->procs[i];
        if (proc->gpu != device->index || proc->graphics != graphics) continue;
        if (proc->ends_with_exit && !process_running(proc->pid)) continue;
        infos[found].pid = proc->pid;
        infos[found].usedGpuMemory = proc->used;
        infos[found].gpuInstanceId = 0xFFFFFFFFu;
        infos[found].computeInstanceId = 0xFFFFFFFFu;
        if (++found == *count) break; /* one more may have started between the two loops */
    }
    *count = found; /* one may have exited between the two loops */
    release_state(state);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                         nvmlProcessInfo_t *infos) {
    return list_processes(device, count, infos, 0);
}

API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device,
                                                          unsigned int *count,
                                                          nvmlProcessInfo_t *infos) {
    return list_processes(device, count, infos, 1);
}

#ifndef SIM_OLD_DRIVER
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                         nvmlProcessInfo_t *infos) {
    return list_processes(device, count, infos, 0);
}

API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                          unsigned int *count,
                                                          nvmlProcessInfo_t *infos) {
    return list_processes(device, count, infos, 1);
}
#endif
