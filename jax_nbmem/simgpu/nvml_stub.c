/*
 * A simulated libnvidia-ml.so.1 for jax_nbmem's tests and no-GPU demo.
 *
 * It answers NVML calls (through the real pynvml, or any other NVML client) from a small text
 * "state file" named by $JAX_NBMEM_SIMGPU_STATE. The variable is looked up and the file read on
 * every call, so another process (or Python code changing os.environ) can change what the "GPU"
 * reports at any time.
 *
 * The format is documented in jax_nbmem/simgpu/state.py (STATE_FORMAT, shown by
 * `python -m jax_nbmem.simgpu --help`), whose reader follows the same rules: a state is used
 * only when it is complete (it ends with an `end` line) and reads the same twice in a row, so a
 * file rewritten in place is never used half-written; a file with a problem (a malformed line, a
 * missing field, a gap in the GPU indices) is reported once on stderr, naming the line, and the
 * last good state of that file stays in use. jaxNbmemSimCheck() exposes this parser to the tests,
 * which feed the same lines to both readers and compare.
 *
 * Functions that are not defined here are simply not exported; pynvml then raises
 * NVMLError_FunctionNotFound, exactly as with an old driver. Building with -DSIM_OLD_DRIVER
 * leaves out nvmlDeviceGetMemoryInfo_v2 and the _v3 process lists for that reason.
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

typedef struct {
    int refs;
    char *path, *text;
    size_t length;
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

/* ------------------------------------------------------------------------------------------ */
/* The parser: one line at a time, the first problem wins (see state.py for the same rules). */

typedef struct {
    char *start;
    size_t length;
} sim_token;

#define SIM_MAX_TOKENS 64

typedef struct {
    char problem[SIM_PROBLEM];
    unsigned int problem_line; /* 0: none yet */
} sim_parse;

static void problem_at(sim_parse *parse, unsigned int line, const char *format, ...) {
    va_list args;
    char what[SIM_PROBLEM - 24];
    unsigned int at = line ? line : 0xFFFFFFFFu; /* no line: after every line */
    if (parse->problem_line && parse->problem_line <= at) return;
    va_start(args, format);
    vsnprintf(what, sizeof what, format, args);
    va_end(args);
    if (line) snprintf(parse->problem, sizeof parse->problem, "line %u: %s", line, what);
    else snprintf(parse->problem, sizeof parse->problem, "%s", what);
    parse->problem_line = at;
}

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

static size_t tokenize(char *line, sim_token *tokens) {
    size_t count = 0;
    char *p = line;
    while (*p && count < SIM_MAX_TOKENS) {
        while (*p && is_blank(*p)) p++;
        if (!*p) break;
        tokens[count].start = p;
        while (*p && !is_blank(*p)) p++;
        tokens[count].length = (size_t)(p - tokens[count].start);
        count++;
    }
    return count;
}

/* A token as a C string, in a buffer of the caller's (cut short to fit). */
static const char *token_text(const sim_token *token, char *buffer, size_t size) {
    size_t n = token->length < size - 1 ? token->length : size - 1;
    memcpy(buffer, token->start, n);
    buffer[n] = '\0';
    return buffer;
}

/* Decimal digits only, no sign, at most 2**64 - 1. */
static int parse_u64(const char *text, size_t length, unsigned long long *out) {
    unsigned long long value = 0;
    size_t i;
    if (length == 0 || length > 20) return 0;
    for (i = 0; i < length; i++) {
        unsigned int digit;
        if (text[i] < '0' || text[i] > '9') return 0;
        digit = (unsigned int)(text[i] - '0');
        if (value > (SIM_NOT_AVAILABLE - digit) / 10) return 0;
        value = value * 10 + digit;
    }
    *out = value;
    return 1;
}

/* The value of KEY= among tokens[from:], the last one given; NULL when absent. */
static const sim_token *find_key(const sim_token *tokens, size_t from, size_t count,
                                 const char *key, sim_token *value) {
    size_t i, n = strlen(key);
    const sim_token *found = NULL;
    for (i = from; i < count; i++) {
        if (tokens[i].length >= n && memcmp(tokens[i].start, key, n) == 0) {
            value->start = tokens[i].start + n;
            value->length = tokens[i].length - n;
            found = value;
        }
    }
    return found;
}

static int call_kind(const sim_token *token) {
    int i;
    for (i = 0; i < CALL_KINDS; i++) {
        if (strlen(sim_call_names[i]) == token->length &&
            memcmp(token->start, sim_call_names[i], token->length) == 0)
            return i;
    }
    return -1;
}

static const struct { const char *name; int code; } sim_error_names[] = {
    {"SUCCESS", 0}, {"UNINITIALIZED", 1}, {"INVALID_ARGUMENT", 2}, {"NOT_SUPPORTED", 3},
    {"NO_PERMISSION", 4}, {"ALREADY_INITIALIZED", 5}, {"NOT_FOUND", 6},
    {"INSUFFICIENT_SIZE", 7}, {"INSUFFICIENT_POWER", 8}, {"DRIVER_NOT_LOADED", 9},
    {"TIMEOUT", 10}, {"IRQ_ISSUE", 11}, {"LIBRARY_NOT_FOUND", 12}, {"FUNCTION_NOT_FOUND", 13},
    {"CORRUPTED_INFOROM", 14}, {"GPU_IS_LOST", 15}, {"RESET_REQUIRED", 16},
    {"OPERATING_SYSTEM", 17}, {"LIB_RM_VERSION_MISMATCH", 18}, {"IN_USE", 19}, {"MEMORY", 20},
    {"NO_DATA", 21}, {"VGPU_ECC_NOT_SUPPORTED", 22}, {"INSUFFICIENT_RESOURCES", 23},
    {"FREQ_NOT_SUPPORTED", 24}, {"ARGUMENT_VERSION_MISMATCH", 25}, {"DEPRECATED", 26},
    {"NOT_READY", 27}, {"GPU_NOT_FOUND", 28}, {"INVALID_STATE", 29}, {"UNKNOWN", 999},
};

/* An error by name (GPU_IS_LOST, or NVML_ERROR_GPU_IS_LOST) or by code; -1 when neither. */
static int error_code(const sim_token *token) {
    unsigned long long code;
    const char *text = token->start;
    size_t length = token->length, i;
    if (parse_u64(text, length, &code)) return code <= 0x7FFFFFFF ? (int)code : -1;
    if (length > 11 && memcmp(text, "NVML_ERROR_", 11) == 0) {
        text += 11;
        length -= 11;
    }
    for (i = 0; i < sizeof sim_error_names / sizeof sim_error_names[0]; i++) {
        if (strlen(sim_error_names[i].name) == length &&
            memcmp(text, sim_error_names[i].name, length) == 0)
            return sim_error_names[i].code;
    }
    return -1;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A byte count (`na` only where allowed), or a problem: 1 when it is good. */
static int bytes_value(sim_parse *parse, unsigned int line, const char *kind, const char *key,
                       const sim_token *value, int na_allowed, unsigned long long *out) {
    char text[48];
    if (na_allowed && value->length == 2 && memcmp(value->start, "na", 2) == 0) {
        *out = SIM_NOT_AVAILABLE;
        return 1;
    }
    if (parse_u64(value->start, value->length, out) && (!na_allowed || *out != SIM_NOT_AVAILABLE))
        return 1;
    problem_at(parse, line, "%s: bad %s '%s'", kind, key, token_text(value, text, sizeof text));
    return 0;
}

/* INDEX or GPU: a number below SIM_MAX_GPUS. */
static int gpu_number(sim_parse *parse, unsigned int line, const char *kind, const char *what,
                      const sim_token *tokens, size_t count, size_t at, unsigned int *out) {
    unsigned long long value;
    char text[48];
    if (at >= count) {
        problem_at(parse, line, "%s: missing %s", kind, what);
        return 0;
    }
    if (!parse_u64(tokens[at].start, tokens[at].length, &value) || value >= SIM_MAX_GPUS) {
        problem_at(parse, line, "%s: bad %s '%s'", kind, what,
                   token_text(&tokens[at], text, sizeof text));
        return 0;
    }
    *out = (unsigned int)value;
    return 1;
}

static void parse_gpu(sim_state *state, sim_parse *parse, unsigned int line, sim_token *tokens,
                      size_t count) {
    unsigned int index;
    unsigned long long value;
    sim_token found;
    sim_gpu gpu;
    size_t i, name_at = count;
    char text[48];

    if (!gpu_number(parse, line, "gpu", "INDEX", tokens, count, 1, &index)) return;
    if (count < 3 || strncmp(tokens[2].start, "name=", 5) == 0) {
        problem_at(parse, line, "gpu: missing UUID");
        return;
    }
    if (tokens[2].length >= SIM_TEXT) {
        problem_at(parse, line, "gpu: UUID longer than %d bytes", SIM_TEXT - 1);
        return;
    }
    memset(&gpu, 0, sizeof gpu);
    gpu.present = 1;
    gpu.line = line;
    gpu.reserved = SIM_DEFAULT_RESERVED;
    token_text(&tokens[2], gpu.uuid, sizeof gpu.uuid);
    /* name= takes the rest of the line; the options are the tokens before it. */
    for (i = 3; i < count; i++) {
        if (tokens[i].length >= 5 && memcmp(tokens[i].start, "name=", 5) == 0) {
            name_at = i;
            break;
        }
    }
    if (!find_key(tokens, 3, name_at, "total=", &found)) {
        problem_at(parse, line, "gpu: missing total=");
        return;
    }
    if (!bytes_value(parse, line, "gpu", "total=", &found, 0, &gpu.total)) return;
    if (find_key(tokens, 3, name_at, "used=", &found)) {
        if (!bytes_value(parse, line, "gpu", "used=", &found, 0, &gpu.used)) return;
        gpu.used_given = 1;
    }
    if (find_key(tokens, 3, name_at, "free=", &found)) {
        if (!bytes_value(parse, line, "gpu", "free=", &found, 0, &gpu.free)) return;
        gpu.free_given = 1;
    }
    if (find_key(tokens, 3, name_at, "reserved=", &found)) {
        if (!bytes_value(parse, line, "gpu", "reserved=", &found, 0, &gpu.reserved)) return;
    }
    if (find_key(tokens, 3, name_at, "util=", &found)) {
        if (!parse_u64(found.start, found.length, &value) || value > 100) {
            problem_at(parse, line, "gpu: bad util= '%s'", token_text(&found, text, sizeof text));
            return;
        }
        gpu.util = (unsigned int)value;
        gpu.util_given = 1;
    }
    if (find_key(tokens, 3, name_at, "mig=", &found)) {
        if (found.length == 2 && memcmp(found.start, "on", 2) == 0) {
            gpu.mig = 1;
        } else if (!(found.length == 3 && memcmp(found.start, "off", 3) == 0)) {
            problem_at(parse, line, "gpu: bad mig= '%s'", token_text(&found, text, sizeof text));
            return;
        }
    }
    for (i = 3; i < name_at; i++) {
        if (tokens[i].length == 3 && memcmp(tokens[i].start, "raw", 3) == 0) gpu.raw = 1;
    }
    if (find_key(tokens, 3, name_at, "namehex=", &found)) {
        size_t n = found.length / 2, k;
        int good = found.length % 2 == 0 && n > 0 && n < SIM_TEXT;
        for (k = 0; good && k < n; k++) {
            int high = hex_digit(found.start[2 * k]), low = hex_digit(found.start[2 * k + 1]);
            if (high < 0 || low < 0 || (high == 0 && low == 0)) good = 0;
            else gpu.name[k] = (char)(high * 16 + low);
        }
        if (!good) {
            problem_at(parse, line, "gpu: bad namehex= '%s'", token_text(&found, text, sizeof text));
            return;
        }
        gpu.name[n] = '\0';
        gpu.name_hex = 1;
    } else if (name_at < count) {
        const char *name = tokens[name_at].start + 5;
        size_t length = strlen(name);
        while (length > 0 && is_blank(name[length - 1])) length--;
        if (length == 0) {
            problem_at(parse, line, "gpu: bad name= ''");
            return;
        }
        if (length >= SIM_TEXT) {
            problem_at(parse, line, "gpu: name= longer than %d bytes", SIM_TEXT - 1);
            return;
        }
        memcpy(gpu.name, name, length);
        gpu.name[length] = '\0';
    } else {
        strcpy(gpu.name, SIM_DEFAULT_NAME);
    }
    if (state->gpus[index].present) {
        problem_at(parse, line, "gpu: GPU %u given twice", index);
        return;
    }
    state->gpus[index] = gpu;
}

static void parse_proc(sim_state *state, sim_parse *parse, unsigned int line, sim_token *tokens,
                       size_t count) {
    unsigned int gpu;
    unsigned long long pid, used;
    sim_token found;
    sim_proc *proc;
    int graphics = 0, ends = 0, mig = -1;
    char text[48];

    if (!gpu_number(parse, line, "proc", "GPU", tokens, count, 1, &gpu)) return;
    if (count < 3) {
        problem_at(parse, line, "proc: missing PID");
        return;
    }
    if (!parse_u64(tokens[2].start, tokens[2].length, &pid) || pid > 0xFFFFFFFFULL) {
        problem_at(parse, line, "proc: bad PID '%s'", token_text(&tokens[2], text, sizeof text));
        return;
    }
    if (!find_key(tokens, 3, count, "used=", &found)) {
        problem_at(parse, line, "proc: missing used=");
        return;
    }
    if (!bytes_value(parse, line, "proc", "used=", &found, 1, &used)) return;
    if (find_key(tokens, 3, count, "kind=", &found)) {
        if (found.length == 8 && memcmp(found.start, "graphics", 8) == 0) {
            graphics = 1;
        } else if (!(found.length == 7 && memcmp(found.start, "compute", 7) == 0)) {
            problem_at(parse, line, "proc: bad kind= '%s'", token_text(&found, text, sizeof text));
            return;
        }
    }
    if (find_key(tokens, 3, count, "ends=", &found)) {
        if (!(found.length == 4 && memcmp(found.start, "exit", 4) == 0)) {
            problem_at(parse, line, "proc: bad ends= '%s'", token_text(&found, text, sizeof text));
            return;
        }
        ends = 1;
    }
    if (find_key(tokens, 3, count, "mig=", &found)) {
        unsigned long long gi;
        if (!parse_u64(found.start, found.length, &gi) || gi >= SIM_MAX_GI) {
            problem_at(parse, line, "proc: bad mig= '%s'", token_text(&found, text, sizeof text));
            return;
        }
        mig = (int)gi;
    }
    if (state->proc_count == state->proc_capacity) {
        unsigned int capacity = state->proc_capacity ? state->proc_capacity * 2 : 64;
        sim_proc *larger = realloc(state->procs, capacity * sizeof *larger);
        if (!larger) {
            problem_at(parse, line, "proc: out of memory");
            return;
        }
        state->procs = larger;
        state->proc_capacity = capacity;
    }
    proc = &state->procs[state->proc_count++];
    proc->gpu = gpu;
    proc->pid = (unsigned int)pid;
    proc->used = used;
    proc->graphics = (unsigned int)graphics;
    proc->ends_with_exit = (unsigned int)ends; /* checked at each call, not here */
    proc->mig = mig;
    proc->line = line;
}

/* mig GPU GI UUID total=BYTES [name=NAME]: a GPU instance of a GPU in MIG mode. */
static void parse_mig(sim_state *state, sim_parse *parse, unsigned int line, sim_token *tokens,
                      size_t count) {
    unsigned int gpu, i, on_gpu = 0;
    unsigned long long gi;
    size_t name_at = count, k;
    sim_token found;
    sim_mig mig;
    char text[48];

    if (!gpu_number(parse, line, "mig", "GPU", tokens, count, 1, &gpu)) return;
    if (count < 3) {
        problem_at(parse, line, "mig: missing GI");
        return;
    }
    if (!parse_u64(tokens[2].start, tokens[2].length, &gi) || gi >= SIM_MAX_GI) {
        problem_at(parse, line, "mig: bad GI '%s'", token_text(&tokens[2], text, sizeof text));
        return;
    }
    if (count < 4 || strncmp(tokens[3].start, "name=", 5) == 0) {
        problem_at(parse, line, "mig: missing UUID");
        return;
    }
    if (tokens[3].length >= SIM_TEXT || tokens[3].length < 5 ||
        memcmp(tokens[3].start, "MIG-", 4) != 0) {
        problem_at(parse, line, "mig: bad UUID '%s' (MIG-...)",
                   token_text(&tokens[3], text, sizeof text));
        return;
    }
    memset(&mig, 0, sizeof mig);
    mig.gpu = gpu;
    mig.gi = (unsigned int)gi;
    mig.line = line;
    token_text(&tokens[3], mig.uuid, sizeof mig.uuid);
    for (k = 4; k < count; k++) {
        if (tokens[k].length >= 5 && memcmp(tokens[k].start, "name=", 5) == 0) {
            name_at = k;
            break;
        }
    }
    if (!find_key(tokens, 4, name_at, "total=", &found)) {
        problem_at(parse, line, "mig: missing total=");
        return;
    }
    if (!bytes_value(parse, line, "mig", "total=", &found, 0, &mig.total)) return;
    if (name_at < count) {
        const char *name = tokens[name_at].start + 5;
        size_t length = strlen(name);
        while (length > 0 && is_blank(name[length - 1])) length--;
        if (length == 0) {
            problem_at(parse, line, "mig: bad name= ''");
            return;
        }
        if (length >= SIM_TEXT) {
            problem_at(parse, line, "mig: name= longer than %d bytes", SIM_TEXT - 1);
            return;
        }
        memcpy(mig.name, name, length);
        mig.name[length] = '\0';
    } else {
        strcpy(mig.name, SIM_DEFAULT_MIG_NAME);
    }
    for (i = 0; i < state->mig_count; i++) {
        if (state->migs[i].gpu != gpu) continue;
        if (state->migs[i].gi == mig.gi) {
            problem_at(parse, line, "mig: instance %u of GPU %u given twice", mig.gi, gpu);
            return;
        }
        on_gpu++;
    }
    if (on_gpu >= SIM_MAX_GI_PER_GPU) {
        problem_at(parse, line, "mig: GPU %u has more than %d instances", gpu, SIM_MAX_GI_PER_GPU);
        return;
    }
    if (state->mig_count >= SIM_MAX_MIGS) {
        problem_at(parse, line, "mig: more than %d instances", SIM_MAX_MIGS);
        return;
    }
    state->migs[state->mig_count++] = mig;
}

/* The instance GI of GPU, or NULL. */
static const sim_mig *find_mig(const sim_state *state, unsigned int gpu, int gi) {
    unsigned int i;
    for (i = 0; i < state->mig_count; i++) {
        if (state->migs[i].gpu == gpu && (int)state->migs[i].gi == gi) return &state->migs[i];
    }
    return NULL;
}

static void parse_line(sim_state *state, sim_parse *parse, unsigned int line, char *text,
                       int *ended) {
    sim_token tokens[SIM_MAX_TOKENS];
    size_t count;
    char *p, word[48];

    /* A comment starts with '#' at the start of the line or after whitespace. */
    for (p = text; *p; p++) {
        if (*p == '#' && (p == text || is_blank(p[-1]))) {
            *p = '\0';
            break;
        }
    }
    count = tokenize(text, tokens);
    if (count == 0) return;
    if (*ended) {
        problem_at(parse, line, "after the end line");
        return;
    }
    token_text(&tokens[0], word, sizeof word);
    if (strcmp(word, "end") == 0) {
        *ended = 1;
    } else if (strcmp(word, "nodriver") == 0) {
        state->nodriver = 1;
    } else if (strcmp(word, "unprivileged") == 0) {
        state->unprivileged = 1;
    } else if (strcmp(word, "mig") == 0) {
        parse_mig(state, parse, line, tokens, count);
    } else if (strcmp(word, "driver") == 0) {
        if (count < 2) problem_at(parse, line, "driver: missing VERSION");
        else if (tokens[1].length >= SIM_DRIVER_TEXT)
            problem_at(parse, line, "driver: VERSION longer than %d bytes", SIM_DRIVER_TEXT - 1);
        else token_text(&tokens[1], state->driver, sizeof state->driver);
    } else if (strcmp(word, "gpu") == 0) {
        parse_gpu(state, parse, line, tokens, count);
    } else if (strcmp(word, "proc") == 0) {
        parse_proc(state, parse, line, tokens, count);
    } else if (strcmp(word, "lost") == 0) {
        unsigned int index;
        if (gpu_number(parse, line, "lost", "GPU", tokens, count, 1, &index)) {
            state->lost[index] = 1;
            if (!state->lost_line[index]) state->lost_line[index] = line;
        }
    } else if (strcmp(word, "slow") == 0) {
        unsigned long long ms;
        int kind;
        char value[48];
        if (count < 2) problem_at(parse, line, "slow: missing CALL");
        else if ((kind = call_kind(&tokens[1])) < 0)
            problem_at(parse, line, "slow: bad CALL '%s'", token_text(&tokens[1], value, sizeof value));
        else if (count < 3) problem_at(parse, line, "slow: missing MS");
        else if (!parse_u64(tokens[2].start, tokens[2].length, &ms) || ms > 0xFFFFFFFFULL)
            problem_at(parse, line, "slow: bad MS '%s'", token_text(&tokens[2], value, sizeof value));
        else {
            state->slow_given[kind] = 1;
            state->slow_ms[kind] = (unsigned int)ms;
        }
    } else if (strcmp(word, "fail") == 0) {
        int kind, error;
        unsigned int gpu = 0;
        char value[48];
        if (count < 2) problem_at(parse, line, "fail: missing CALL");
        else if ((kind = call_kind(&tokens[1])) < 0)
            problem_at(parse, line, "fail: bad CALL '%s'", token_text(&tokens[1], value, sizeof value));
        else if (count < 3) problem_at(parse, line, "fail: missing ERROR");
        else if ((error = error_code(&tokens[2])) < 0)
            problem_at(parse, line, "fail: bad ERROR '%s'",
                       token_text(&tokens[2], value, sizeof value));
        else if (count > 3 && !gpu_number(parse, line, "fail", "GPU", tokens, count, 3, &gpu))
            return;
        else if (state->fault_count >= SIM_MAX_FAULTS)
            problem_at(parse, line, "fail: more than %d faults", SIM_MAX_FAULTS);
        else {
            sim_fault *fault = &state->faults[state->fault_count++];
            fault->call = kind;
            fault->error = error;
            fault->gpu = count > 3 ? (int)gpu : -1;
            fault->line = line;
        }
    }
    /* Any other line is ignored (a later format's, or a note): see STATE_FORMAT. */
}

static int by_gpu_pid_line(const void *a, const void *b) {
    const sim_proc *x = *(sim_proc *const *)a, *y = *(sim_proc *const *)b;
    if (x->gpu != y->gpu) return x->gpu < y->gpu ? -1 : 1;
    if (x->pid != y->pid) return x->pid < y->pid ? -1 : 1;
    return x->line < y->line ? -1 : x->line > y->line;
}

/* What the lines cannot tell alone: dense indices, references to GPUs, one figure a process. */
static void check_state(sim_state *state, sim_parse *parse) {
    unsigned int i, missing = SIM_MAX_GPUS;
    sim_proc **order;
    for (i = 0; i < SIM_MAX_GPUS; i++) {
        if (!state->gpus[i].present) {
            if (missing == SIM_MAX_GPUS) missing = i;
        } else {
            state->gpu_count++;
            if (missing < i)
                problem_at(parse, state->gpus[i].line,
                           "gpu: GPU %u without GPU %u (indices run 0, 1, 2 ...)", i, missing);
        }
    }
    for (i = 0; i < state->proc_count; i++) {
        const sim_proc *proc = &state->procs[i];
        const sim_gpu *gpu = &state->gpus[proc->gpu];
        if (!gpu->present)
            problem_at(parse, proc->line, "proc: no GPU %u", proc->gpu);
        else if (gpu->mig && proc->mig < 0)
            problem_at(parse, proc->line, "proc: GPU %u is in MIG mode: which instance (mig=GI)?",
                       proc->gpu);
        else if (proc->mig >= 0 && !find_mig(state, proc->gpu, proc->mig))
            problem_at(parse, proc->line, "proc: no MIG instance %d on GPU %u", proc->mig,
                       proc->gpu);
    }
    for (i = 0; i < state->mig_count; i++) {
        const sim_mig *mig = &state->migs[i];
        if (!state->gpus[mig->gpu].present)
            problem_at(parse, mig->line, "mig: no GPU %u", mig->gpu);
        else if (!state->gpus[mig->gpu].mig)
            problem_at(parse, mig->line, "mig: GPU %u is not in MIG mode (mig=on)", mig->gpu);
    }
    for (i = 0; i < SIM_MAX_GPUS; i++) {
        if (state->lost[i] && !state->gpus[i].present)
            problem_at(parse, state->lost_line[i], "lost: no GPU %u", i);
    }
    for (i = 0; i < state->fault_count; i++) {
        const sim_fault *fault = &state->faults[i];
        if (fault->gpu >= 0 && !state->gpus[fault->gpu].present)
            problem_at(parse, fault->line, "fail: no GPU %d", fault->gpu);
    }
    if (state->proc_count < 2) return;
    order = malloc(state->proc_count * sizeof *order);
    if (!order) {
        problem_at(parse, 0, "out of memory");
        return;
    }
    for (i = 0; i < state->proc_count; i++) order[i] = &state->procs[i];
    qsort(order, state->proc_count, sizeof *order, by_gpu_pid_line);
    for (i = 1; i < state->proc_count; i++) {
        const sim_proc *first = order[i - 1], *proc = order[i];
        unsigned int j;
        if (proc->gpu != first->gpu || proc->pid != first->pid) continue;
        /* The group of this (gpu, pid) runs back to its first line. */
        for (j = i; j > 0 && order[j - 1]->gpu == proc->gpu && order[j - 1]->pid == proc->pid;)
            j--;
        first = order[j];
        for (; j < i; j++) {
            if (order[j]->graphics == proc->graphics) {
                problem_at(parse, proc->line, "proc: PID %u listed twice on GPU %u", proc->pid,
                           proc->gpu);
                break;
            }
        }
        if (j == i && proc->used != first->used)
            problem_at(parse, proc->line, "proc: PID %u has two figures on GPU %u", proc->pid,
                       proc->gpu);
    }
    free(order);
}

static void free_state(sim_state *state) {
    if (!state) return;
    free(state->procs);
    free(state->path);
    free(state->text);
    free(state);
}

/* Whether a line of TEXT is `end` (its first word, before any comment). */
static int has_end_line(const char *text) {
    const char *line = text;
    while (line && *line) {
        const char *p = line;
        while (is_blank(*p)) p++;
        if (strncmp(p, "end", 3) == 0 && (p[3] == '\0' || p[3] == '\n' || is_blank(p[3])))
            return 1;
        line = strchr(line, '\n');
        if (line) line++;
    }
    return 0;
}

/* Parses TEXT (which it keeps, and does not change) into a new state; NULL with the problem
 * in parse->problem when the text has one. */
static sim_state *parse_state(char *text, size_t length, sim_parse *parse) {
    sim_state *state = calloc(1, sizeof *state);
    char *copy, *line, *next;
    unsigned int number = 0;
    int ended = 0;
    parse->problem_line = 0;
    parse->problem[0] = '\0';
    if (!state || !(copy = malloc(length + 1))) {
        free(state);
        problem_at(parse, 0, "out of memory");
        return NULL;
    }
    memcpy(copy, text, length);
    copy[length] = '\0';
    strcpy(state->driver, SIM_DEFAULT_DRIVER);
    /* Without its end line the file is incomplete (being written): what its lines say, even
     * a half-written last one, is not a problem of the state. */
    if (!has_end_line(copy)) {
        free(copy);
        free_state(state);
        problem_at(parse, 0, "no end line: the file is incomplete");
        return NULL;
    }
    for (line = copy; line && !parse->problem_line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        parse_line(state, parse, ++number, line, &ended);
        if (next && !*next) break;
    }
    free(copy);
    if (!parse->problem_line && !ended) problem_at(parse, 0, "no end line: the file is incomplete");
    if (!parse->problem_line) check_state(state, parse);
    if (parse->problem_line) {
        free_state(state);
        return NULL;
    }
    state->text = text;
    state->length = length;
    return state;
}

/* ------------------------------------------------------------------------------------------ */
/* The state in use: read twice until two reads agree, parsed once per change, shared.       */

static pthread_mutex_t sim_lock = PTHREAD_MUTEX_INITIALIZER;
static sim_state *sim_good;   /* the last good state read, of sim_good->path */
static char *sim_bad_text;    /* the last text with a problem, and whose it was */
static size_t sim_bad_length;
static char *sim_bad_path;
static int sim_bad_said;
static time_t sim_bad_since;
static sim_parse sim_bad_parse;

enum { READ_OK, READ_MISSING, READ_UNSTABLE, READ_NO_MEMORY };

/* The whole file, in a buffer of its own (sized by fstat, grown if the file grows). */
static int read_text(const char *path, char **out, size_t *length) {
    struct stat info;
    size_t capacity, used = 0;
    ssize_t got;
    char *text;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return READ_MISSING;
    capacity = fstat(fd, &info) == 0 && info.st_size > 0 ? (size_t)info.st_size + 4096 : 65536;
    text = malloc(capacity + 1);
    while (text) {
        got = read(fd, text + used, capacity - used);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        used += (size_t)got;
        if (used == capacity) {
            char *larger = realloc(text, capacity * 2 + 1);
            if (!larger) {
                free(text);
                text = NULL;
                break;
            }
            text = larger;
            capacity *= 2;
        }
    }
    close(fd);
    if (!text) return READ_NO_MEMORY;
    text[used] = '\0';
    *out = text;
    *length = used;
    return READ_OK;
}

/* The file's text once two reads in a row agree: never a mix of two writes. */
static int read_stable(const char *path, char **out, size_t *length) {
    char *first = NULL, *second = NULL;
    size_t first_length = 0, second_length = 0;
    int tries, got = read_text(path, &first, &first_length);
    if (got != READ_OK) return got;
    for (tries = 0; tries < SIM_STABLE_READS; tries++) {
        if ((got = read_text(path, &second, &second_length)) != READ_OK) {
            free(first);
            return got;
        }
        if (first_length == second_length && memcmp(first, second, first_length) == 0) {
            free(second);
            *out = first;
            *length = first_length;
            return READ_OK;
        }
        free(first);
        first = second;
        first_length = second_length;
    }
    free(first);
    return READ_UNSTABLE;
}

static int same_text(const char *a, size_t a_length, const char *b, size_t b_length) {
    return a && b && a_length == b_length && memcmp(a, b, a_length) == 0;
}

static void release_state(sim_state *state);

/* Whether the file holds exactly TEXT (LENGTH bytes). */
static int file_matches(const char *path, const char *text, size_t length) {
    char chunk[16384];
    struct stat info;
    size_t seen = 0;
    ssize_t got;
    int fd = open(path, O_RDONLY | O_CLOEXEC), same = 0;
    if (fd < 0) return 0;
    if (fstat(fd, &info) == 0 && (size_t)info.st_size == length) {
        same = 1;
        while (same) {
            got = read(fd, chunk, sizeof chunk);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) break;
            if (seen + (size_t)got > length || memcmp(chunk, text + seen, (size_t)got) != 0) same = 0;
            seen += (size_t)got;
        }
        same = same && seen == length;
    }
    close(fd);
    return same;
}

/* Says a bad state once: a problem at once, an incomplete file only when it stays so. */
static void say_problem(const char *path) {
    int incomplete = sim_bad_parse.problem_line == 0xFFFFFFFFu;
    if (sim_bad_said || (incomplete && time(NULL) - sim_bad_since < SIM_QUIET_INCOMPLETE_S))
        return;
    sim_bad_said = 1;
    fprintf(stderr, "jax_nbmem simulated GPU: %s: %s; %s\n", path, sim_bad_parse.problem,
            sim_good ? "the last good state stays in use" : "no GPU until it is fixed");
}

/* Loads the state named by the environment; NULL with *ret set when there is none. */
static sim_state *load_state(nvmlReturn_t *ret) {
    const char *path = getenv("JAX_NBMEM_SIMGPU_STATE");
    sim_state *use = NULL;
    char *text = NULL;
    size_t length = 0;
    int got;

    if (!path || !*path) {
        *ret = NVML_ERROR_DRIVER_NOT_LOADED;
        return NULL;
    }
    /* The common case, a file unchanged since it was parsed: one read, compared as it comes
     * (a read that equals a complete state is that state), nothing allocated. */
    pthread_mutex_lock(&sim_lock);
    use = sim_good && !sim_good->nodriver && strcmp(sim_good->path, path) == 0 ? sim_good : NULL;
    if (use) use->refs++;
    pthread_mutex_unlock(&sim_lock);
    if (use) {
        if (file_matches(path, use->text, use->length)) {
            *ret = NVML_SUCCESS;
            return use;
        }
        release_state(use);
        use = NULL;
    }
    got = read_stable(path, &text, &length);
    if (got == READ_MISSING) {
        *ret = NVML_ERROR_DRIVER_NOT_LOADED;
        return NULL;
    }
    if (got == READ_NO_MEMORY) {
        *ret = NVML_ERROR_MEMORY;
        return NULL;
    }
    pthread_mutex_lock(&sim_lock);
    if (sim_good && strcmp(sim_good->path, path) != 0) {
        if (--sim_good->refs == 0) free_state(sim_good);
        sim_good = NULL;
    }
    if (got == READ_OK && sim_good && same_text(text, length, sim_good->text, sim_good->length)) {
        free(text);
    } else if (got == READ_OK && same_text(text, length, sim_bad_text, sim_bad_length) &&
               sim_bad_path && strcmp(sim_bad_path, path) == 0) {
        free(text);
        say_problem(path);
    } else if (got == READ_OK) {
        sim_parse parse;
        sim_state *parsed = parse_state(text, length, &parse);
        char *own_path = parsed ? strdup(path) : NULL;
        if (parsed && own_path) {
            parsed->path = own_path;
            parsed->refs = 1;
            if (sim_good && --sim_good->refs == 0) free_state(sim_good);
            sim_good = parsed;
        } else if (parsed) {
            free_state(parsed); /* it owned text */
        } else {
            free(sim_bad_text);
            free(sim_bad_path);
            sim_bad_text = text;
            sim_bad_length = length;
            sim_bad_path = strdup(path);
            sim_bad_said = 0;
            sim_bad_since = time(NULL);
            sim_bad_parse = parse;
            say_problem(path);
        }
    }
    /* READ_UNSTABLE: a writer rewrites it as we read; what was good stays in use. */
    use = sim_good;
    if (use) use->refs++;
    pthread_mutex_unlock(&sim_lock);
    if (!use) {
        *ret = NVML_ERROR_DRIVER_NOT_LOADED;
        return NULL;
    }
    if (use->nodriver) {
        pthread_mutex_lock(&sim_lock);
        if (--use->refs == 0) free_state(use);
        pthread_mutex_unlock(&sim_lock);
        *ret = NVML_ERROR_DRIVER_NOT_LOADED;
        return NULL;
    }
    *ret = NVML_SUCCESS;
    return use;
}

static void release_state(sim_state *state) {
    if (!state) return;
    pthread_mutex_lock(&sim_lock);
    if (--state->refs == 0) free_state(state);
    pthread_mutex_unlock(&sim_lock);
}

/* ------------------------------------------------------------------------------------------ */
/* The state's canonical text (what SimState.render() writes), for the agreement tests.       */

typedef struct {
    char *out;
    size_t size, used;
} sim_out;

static void put(sim_out *out, const char *format, ...) {
    va_list args;
    int n;
    size_t room = out->used < out->size ? out->size - out->used : 0;
    va_start(args, format);
    n = vsnprintf(out->out + (room ? out->used : 0), room, format, args);
    va_end(args);
    if (n > 0) out->used += (size_t)n;
}

static void render_state(const sim_state *state, sim_out *out) {
    unsigned int i;
    put(out, "# jax_nbmem simulated GPU state\ndriver %s\n", state->driver);
    if (state->nodriver) put(out, "nodriver\n");
    if (state->unprivileged) put(out, "unprivileged\n");
    for (i = 0; i < SIM_MAX_GPUS; i++) {
        const sim_gpu *gpu = &state->gpus[i];
        if (!gpu->present) continue;
        put(out, "gpu %u %s total=%llu", i, gpu->uuid, gpu->total);
        if (gpu->used_given) put(out, " used=%llu", gpu->used);
        if (gpu->free_given) put(out, " free=%llu", gpu->free);
        put(out, " reserved=%llu%s", gpu->reserved, gpu->raw ? " raw" : "");
        if (gpu->util_given) put(out, " util=%u", gpu->util);
        if (gpu->mig) put(out, " mig=on");
        if (gpu->name_hex) {
            const unsigned char *c;
            put(out, " namehex=");
            for (c = (const unsigned char *)gpu->name; *c; c++) put(out, "%02x", *c);
            put(out, "\n");
        } else {
            put(out, " name=%s\n", gpu->name);
        }
    }
    for (i = 0; i < SIM_MAX_GPUS; i++) {
        unsigned int gi;
        for (gi = 0; gi < SIM_MAX_GI; gi++) {
            const sim_mig *mig = find_mig(state, i, (int)gi);
            if (mig) put(out, "mig %u %u %s total=%llu name=%s\n", i, gi, mig->uuid, mig->total,
                         mig->name);
        }
    }
    for (i = 0; i < state->proc_count; i++) {
        const sim_proc *proc = &state->procs[i];
        put(out, "proc %u %u used=", proc->gpu, proc->pid);
        if (proc->used == SIM_NOT_AVAILABLE) put(out, "na");
        else put(out, "%llu", proc->used);
        put(out, " kind=%s", proc->graphics ? "graphics" : "compute");
        if (proc->mig >= 0) put(out, " mig=%d", proc->mig);
        put(out, "%s\n", proc->ends_with_exit ? " ends=exit" : "");
    }
    for (i = 0; i < SIM_MAX_GPUS; i++) {
        if (state->lost[i]) put(out, "lost %u\n", i);
    }
    for (i = 0; i < CALL_KINDS; i++) {
        if (state->slow_given[i]) put(out, "slow %s %u\n", sim_call_names[i], state->slow_ms[i]);
    }
    for (i = 0; i < state->fault_count; i++) {
        const sim_fault *fault = &state->faults[i];
        put(out, "fail %s %d", sim_call_names[fault->call], fault->error);
        if (fault->gpu >= 0) put(out, " %d", fault->gpu);
        put(out, "\n");
    }
    put(out, "end\n");
}

/* Not NVML: parses TEXT as a state file; 0 and its canonical text in OUT, or 1 and the
 * problem. OUT is always NUL-terminated (cut short when LENGTH is too small). */
API int jaxNbmemSimCheck(const char *text, char *out, unsigned int length) {
    size_t size = strlen(text);
    char *own = malloc(size + 1);
    sim_parse parse;
    sim_state *state;
    sim_out rendered = {out, length, 0};
    if (!own || !length) {
        free(own);
        return 2;
    }
    memcpy(own, text, size + 1);
    state = parse_state(own, size, &parse);
    if (!state) {
        free(own);
        snprintf(out, length, "%s", parse.problem);
        return 1;
    }
    render_state(state, &rendered);
    out[length - 1] = '\0';
    free_state(state);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Calls.                                                                                     */

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
    for (i = 0; i < state->proc_count; i++) {
        const sim_proc *proc = &state->procs[i];
        if (proc->gpu != index || proc->used == SIM_NOT_AVAILABLE) continue;
        if (mig >= 0 && proc->mig != mig) continue;
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

/* The texts of NVIDIA's libnvidia-ml (as DCGM's copy of them spells them). */
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
        case 21: return "No data";
        case 22: return "The requested vgpu operation is not available on target device, "
                        "because ECC is enabled";
        case 23: return "Insufficient Resources";
        case 24: return "Ran out of critical resources, other than memory";
        case 25: return "Argument version mismatch";
        case 26: return "The requested functionality has been deprecated";
        case 27: return "The system is not ready for the request";
        case 28: return "The GPU is not found";
        case 29: return "Invalid state";
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

/* NVML's two-call protocol: a short (or NULL) array gets INSUFFICIENT_SIZE and the count.
 * `size` is the caller's struct: v1 (pid, bytes) or later (with the instance ids). */
static nvmlReturn_t list_processes(nvmlDevice_t device, unsigned int *count, void *infos,
                                   unsigned int graphics, size_t size) {
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
    if (parent_refused(state, &state->gpus[device->index], device)) {
        release_state(state);
        return NVML_ERROR_NO_PERMISSION;
    }
    for (i = 0; i < state->proc_count; i++) {
        const sim_proc *proc = &state->procs[i];
        if (proc->gpu != device->index || proc->graphics != graphics) continue;
        if (device->mig >= 0 && proc->mig != device->mig) continue;
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
    for (i = 0; i < state->proc_count && found < *count; i++) {
        const sim_proc *proc = &state->procs[i];
        if (proc->gpu != device->index || proc->graphics != graphics) continue;
        if (device->mig >= 0 && proc->mig != device->mig) continue;
        if (proc->ends_with_exit && !process_running(proc->pid)) continue;
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

/* ------------------------------------------------------------------------------------------ */
/* What other NVML clients (nvitop, gpustat, nvidia-smi-like tools) ask: plausible figures of */
/* an H200 SXM that follow the state (its utilization, its processes). `fail info` and        */
/* `slow info` reach all of them.                                                             */

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct { unsigned long long bar1Total, bar1Free, bar1Used; } nvmlBAR1Memory_t;

typedef struct {
    unsigned int version;
    int sensorType;
    int temperature;
} nvmlTemperature_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
    unsigned long long usedGpuCcProtectedMemory;
} nvmlProcessDetail_v1_t;

typedef struct {
    unsigned int version, mode, numProcArrayEntries;
    nvmlProcessDetail_v1_t *procArray;
} nvmlProcessDetailList_t;

typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    unsigned int valueType;
    nvmlReturn_t nvmlReturn;
    unsigned long long value;
} nvmlFieldValue_t;

#define SIM_TEMPERATURE_V1 0x100000Cu
#define SIM_PROCESS_DETAIL_LIST_V1 (unsigned int)(sizeof(nvmlProcessDetailList_t) | (1u << 24))
#define SIM_POWER_LIMIT_MW 700000u
#define SIM_IDLE_POWER_MW 72000u
#define SIM_CUDA_VERSION 12040 /* what a 550 driver supports */

/* Begins a device call of the "info" kind: the GPU, or NULL with *ret set. */
static sim_gpu *begin_info(nvmlDevice_t device, sim_state **state, nvmlReturn_t *ret) {
    sim_gpu *gpu = begin_device_call(device, state, ret);
    if (!gpu) return NULL;
    if (device->mig >= 0) { /* an instance has no sensors, clocks or PCI of its own */
        release_state(*state);
        *state = NULL;
        *ret = NVML_ERROR_NOT_SUPPORTED;
        return NULL;
    }
    if ((*ret = sim_enter(state, CALL_INFO, (int)device->index)) != NVML_SUCCESS) return NULL;
    return gpu;
}

/* Ends one: releases the state and returns ret. */
static nvmlReturn_t end_info(sim_state *state, nvmlReturn_t ret) {
    release_state(state);
    return ret;
}

/* Bus numbers of the eight GPUs of an HGX H200 board, then made-up ones. */
static unsigned int pci_bus(unsigned int index) {
    static const unsigned int buses[8] = {0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB};
    return index < 8 ? buses[index] : 0xE0 + index;
}

static void fill_pci(unsigned int index, nvmlPciInfo_t *pci) {
    memset(pci, 0, sizeof *pci);
    pci->domain = 0;
    pci->bus = pci_bus(index);
    pci->device = 0;
    pci->pciDeviceId = 0x233510DEu; /* device 0x2335, vendor NVIDIA */
    pci->pciSubSystemId = 0x18BE10DEu;
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:00.0", 0u, pci->bus);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:00.0", 0u, pci->bus);
}

static unsigned int running_processes(const sim_state *state, unsigned int index) {
    unsigned int i, found = 0;
    for (i = 0; i < state->proc_count; i++) {
        const sim_proc *proc = &state->procs[i];
        if (proc->gpu == index && !proc->graphics &&
            !(proc->ends_with_exit && !process_running(proc->pid)))
            found++;
    }
    return found;
}

static unsigned int gpu_util(const sim_gpu *gpu) { return gpu->util_given ? gpu->util : 0; }

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    nvmlReturn_t ret;
    sim_state *state = begin_call(&ret);
    if (!state) return ret;
    if ((ret = sim_enter(&state, CALL_DRIVER, -1)) != NVML_SUCCESS) return ret;
    if (!version) ret = NVML_ERROR_INVALID_ARGUMENT;
    else *version = SIM_CUDA_VERSION;
    release_state(state);
    return ret;
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    return nvmlSystemGetCudaDriverVersion(version);
}

API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    nvmlReturn_t ret;
    char text[SIM_DRIVER_TEXT + 8];
    sim_state *state = begin_call(&ret);
    if (!state) return ret;
    snprintf(text, sizeof text, "12.%s", state->driver);
    ret = copy_string(version, length, text);
    release_state(state);
    return ret;
}

static nvmlReturn_t handle_where(nvmlDevice_t *device, const char *uuid, const char *bus_id) {
    nvmlReturn_t ret;
    sim_state *state = begin_call(&ret);
    unsigned int i;
    if (!state) return ret;
    if (!device || (!uuid && !bus_id)) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    ret = NVML_ERROR_NOT_FOUND;
    for (i = 0; uuid && i < state->mig_count; i++) {
        const sim_mig *mig = &state->migs[i];
        if (strcmp(uuid, mig->uuid) != 0 || !state->gpus[mig->gpu].mig) continue;
        if (state->lost[mig->gpu]) return end_info(state, NVML_ERROR_GPU_IS_LOST);
        sim_mig_handles[mig->gpu][mig->gi].index = mig->gpu;
        sim_mig_handles[mig->gpu][mig->gi].mig = (int)mig->gi;
        *device = &sim_mig_handles[mig->gpu][mig->gi];
        return end_info(state, NVML_SUCCESS);
    }
    for (i = 0; i < SIM_MAX_GPUS; i++) {
        nvmlPciInfo_t pci;
        if (!state->gpus[i].present) continue;
        fill_pci(i, &pci);
        if ((uuid && strcmp(uuid, state->gpus[i].uuid) == 0) ||
            (bus_id && (strcasecmp(bus_id, pci.busId) == 0 ||
                        strcasecmp(bus_id, pci.busIdLegacy) == 0))) {
            if (state->lost[i]) {
                ret = NVML_ERROR_GPU_IS_LOST;
            } else {
                sim_handles[i].index = i;
                sim_handles[i].mig = -1;
                *device = &sim_handles[i];
                ret = NVML_SUCCESS;
            }
            break;
        }
    }
    return end_info(state, ret);
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    return handle_where(device, uuid ? uuid : "", NULL);
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device) {
    return handle_where(device, NULL, bus_id ? bus_id : "");
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus_id, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    nvmlReturn_t ret;
    sim_state *state;
    if (!begin_info(device, &state, &ret)) return ret;
    if (!pci) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    fill_pci(device->index, pci);
    return end_info(state, NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

/* One unsigned figure of a device, computed from its state by `what`. */
typedef unsigned int (*sim_figure)(const sim_state *, const sim_gpu *, unsigned int index);

static nvmlReturn_t device_figure(nvmlDevice_t device, unsigned int *out, sim_figure what) {
    nvmlReturn_t ret;
    sim_state *state;
    sim_gpu *gpu = begin_info(device, &state, &ret);
    if (!gpu) return ret;
    if (!out) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    *out = what(state, gpu, device->index);
    return end_info(state, NVML_SUCCESS);
}

/* A function that the device does not support (Windows' driver models, a fan on an SXM
 * board, confidential computing): it exists, and says NOT_SUPPORTED, as a real driver does. */
static nvmlReturn_t not_supported(nvmlDevice_t device) {
    nvmlReturn_t ret;
    sim_state *state;
    if (!begin_info(device, &state, &ret)) return ret;
    return end_info(state, NVML_ERROR_NOT_SUPPORTED);
}

static unsigned int figure_zero(const sim_state *s, const sim_gpu *g, unsigned int i) {
    (void)s, (void)g, (void)i;
    return 0;
}
static unsigned int figure_one(const sim_state *s, const sim_gpu *g, unsigned int i) {
    (void)s, (void)g, (void)i;
    return 1;
}
static unsigned int figure_index(const sim_state *s, const sim_gpu *g, unsigned int i) {
    (void)s, (void)g;
    return i;
}
static unsigned int figure_temperature(const sim_state *s, const sim_gpu *g, unsigned int i) {
    (void)s, (void)i;
    return 30 + gpu_util(g) * 4 / 10;
}
static unsigned int figure_power(const sim_state *s, const sim_gpu *g, unsigned int i) {
    unsigned int busy = running_processes(s, i) ? 18000u : 0u; /* contexts keep clocks up */
    return SIM_IDLE_POWER_MW + busy + gpu_util(g) * (SIM_POWER_LIMIT_MW - 120000u) / 100;
}
static unsigned int figure_power_limit(const sim_state *s, const sim_gpu *g, unsigned int i) {
    (void)s, (void)g, (void)i;
    return SIM_POWER_LIMIT_MW;
}
static unsigned int figure_max_mig(const sim_state *s, const sim_gpu *g, unsigned int i) {
    (void)s, (void)g, (void)i;
    return 7;
}

API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    return device_figure(device, minor, figure_index);
}
API nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, int *mode) {
    return device_figure(device, (unsigned int *)mode, figure_zero); /* DEFAULT */
}
API nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, int *mode) {
    return device_figure(device, (unsigned int *)mode, figure_one); /* on, as on servers */
}
API nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t device, int *active) {
    return device_figure(device, (unsigned int *)active, figure_zero);
}
API nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t device, int *mode) {
    return device_figure(device, (unsigned int *)mode, figure_zero);
}
API nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, int *pstate) {
    return device_figure(device, (unsigned int *)pstate, figure_zero); /* P0 */
}
API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *milliwatts) {
    return device_figure(device, milliwatts, figure_power);
}
API nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *mw) {
    return device_figure(device, mw, figure_power_limit);
}
API nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device, unsigned int *mw) {
    return device_figure(device, mw, figure_power_limit);
}
API nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *mw) {
    return device_figure(device, mw, figure_power_limit);
}
API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    return device_figure(device, count, figure_max_mig);
}
API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *is_mig) {
    nvmlReturn_t ret;
    sim_state *state;
    if (!begin_device_call(device, &state, &ret)) return ret;
    if (!is_mig) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    *is_mig = device->mig >= 0;
    return end_info(state, NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temp) {
    if (sensor != 0) return NVML_ERROR_INVALID_ARGUMENT; /* NVML_TEMPERATURE_GPU only */
    return device_figure(device, temp, figure_temperature);
}

API nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temp) {
    nvmlReturn_t ret;
    sim_state *state;
    sim_gpu *gpu = begin_info(device, &state, &ret);
    if (!gpu) return ret;
    if (!temp) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    if (temp->version != SIM_TEMPERATURE_V1)
        return end_info(state, NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (temp->sensorType != 0) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    temp->temperature = (int)figure_temperature(state, gpu, device->index);
    return end_info(state, NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed) {
    (void)speed;
    return not_supported(device);
}
API nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t device, unsigned int fan,
                                          unsigned int *speed) {
    (void)fan, (void)speed;
    return not_supported(device);
}
API nvmlReturn_t nvmlDeviceGetCurrentDriverModel(nvmlDevice_t device, int *model) {
    (void)model;
    return not_supported(device);
}
API nvmlReturn_t nvmlDeviceGetPendingDriverModel(nvmlDevice_t device, int *model) {
    (void)model;
    return not_supported(device);
}
API nvmlReturn_t nvmlDeviceGetDriverModel(nvmlDevice_t device, int *current, int *pending) {
    (void)current, (void)pending;
    return not_supported(device);
}
API nvmlReturn_t nvmlDeviceGetDriverModel_v2(nvmlDevice_t device, int *current, int *pending) {
    (void)current, (void)pending;
    return not_supported(device);
}
API nvmlReturn_t nvmlDeviceGetConfComputeMemSizeInfo(nvmlDevice_t device, void *info) {
    (void)info;
    return not_supported(device);
}

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    nvmlReturn_t ret;
    sim_state *state;
    if (!begin_info(device, &state, &ret)) return ret;
    if (!major || !minor) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    *major = 9; /* Hopper */
    *minor = 0;
    return end_info(state, NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *rates) {
    nvmlReturn_t ret;
    sim_state *state;
    sim_gpu *gpu = begin_info(device, &state, &ret);
    if (!gpu) return ret;
    if (gpu->mig) return end_info(state, NVML_ERROR_NOT_SUPPORTED); /* as in MIG mode */
    if (!rates) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    rates->gpu = gpu_util(gpu);
    rates->memory = gpu_util(gpu) / 2; /* memory bandwidth, not capacity */
    return end_info(state, NVML_SUCCESS);
}

static nvmlReturn_t codec_utilization(nvmlDevice_t device, unsigned int *util,
                                      unsigned int *period_us) {
    nvmlReturn_t ret;
    sim_state *state;
    if (!begin_info(device, &state, &ret)) return ret;
    if (!util || !period_us) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    *util = 0;
    *period_us = 167000;
    return end_info(state, NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *util,
                                                 unsigned int *period_us) {
    return codec_utilization(device, util, period_us);
}
API nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *util,
                                                 unsigned int *period_us) {
    return codec_utilization(device, util, period_us);
}

/* Samples of the running compute processes since `last_seen` (microseconds): the GPU's
 * utilization shared among them; NOT_FOUND when none runs, as the driver says. */
API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                 nvmlProcessUtilizationSample_t *samples,
                                                 unsigned int *count,
                                                 unsigned long long last_seen) {
    nvmlReturn_t ret;
    sim_state *state;
    struct timespec now;
    unsigned long long stamp;
    unsigned int i, found = 0, running;
    sim_gpu *gpu = begin_info(device, &state, &ret);
    if (!gpu) return ret;
    if (gpu->mig) return end_info(state, NVML_ERROR_NOT_SUPPORTED);
    if (!count) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    running = running_processes(state, device->index);
    clock_gettime(CLOCK_REALTIME, &now);
    stamp = (unsigned long long)now.tv_sec * 1000000ULL + (unsigned long long)now.tv_nsec / 1000;
    if (running == 0 || last_seen >= stamp) return end_info(state, NVML_ERROR_NOT_FOUND);
    if (!samples || *count < running) {
        *count = running;
        return end_info(state, NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (i = 0; i < state->proc_count && found < running; i++) {
        const sim_proc *proc = &state->procs[i];
        if (proc->gpu != device->index || proc->graphics ||
            (proc->ends_with_exit && !process_running(proc->pid)))
            continue;
        samples[found].pid = proc->pid;
        samples[found].timeStamp = stamp;
        samples[found].smUtil = gpu_util(gpu) / running;
        samples[found].memUtil = gpu_util(gpu) / 2 / running;
        samples[found].encUtil = 0;
        samples[found].decUtil = 0;
        found++;
    }
    *count = found;
    return end_info(state, NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int error_type, int counter_type,
                                             unsigned long long *count) {
    nvmlReturn_t ret;
    sim_state *state;
    (void)error_type, (void)counter_type;
    if (!begin_info(device, &state, &ret)) return ret;
    if (!count) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    *count = 0;
    return end_info(state, NVML_SUCCESS);
}

/* Clocks in MHz: graphics, SM, memory, video (NVML_CLOCK_*); idle ones until the GPU works. */
static nvmlReturn_t clock_info(nvmlDevice_t device, int type, unsigned int *mhz, int max) {
    static const unsigned int top[4] = {1980, 1980, 3201, 1545};
    static const unsigned int idle[4] = {345, 345, 3201, 765};
    nvmlReturn_t ret;
    sim_state *state;
    sim_gpu *gpu = begin_info(device, &state, &ret);
    if (!gpu) return ret;
    if (!mhz || type < 0 || type > 3) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    *mhz = max || gpu_util(gpu) > 0 || running_processes(state, device->index) ? top[type]
                                                                                : idle[type];
    return end_info(state, NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *mhz) {
    return clock_info(device, type, mhz, 0);
}
API nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, int type, unsigned int *mhz) {
    return clock_info(device, type, mhz, 1);
}

API nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, int counter,
                                             unsigned int *kib_per_s) {
    nvmlReturn_t ret;
    sim_state *state;
    if (!begin_info(device, &state, &ret)) return ret;
    if (!kib_per_s || counter < 0 || counter > 1) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    *kib_per_s = 0;
    return end_info(state, NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1) {
    nvmlReturn_t ret;
    sim_state *state;
    if (!begin_info(device, &state, &ret)) return ret;
    if (!bar1) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    bar1->bar1Total = 256ULL << 30;
    bar1->bar1Used = (1ULL << 20) * (1 + 2ULL * running_processes(state, device->index));
    bar1->bar1Free = bar1->bar1Total - bar1->bar1Used;
    return end_info(state, NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    nvmlReturn_t ret;
    sim_state *state;
    char text[32];
    if (!begin_info(device, &state, &ret)) return ret;
    snprintf(text, sizeof text, "16549220%05u", device->index);
    return end_info(state, copy_string(serial, length, text));
}

/* MPS: no MPS server runs here, so its list is empty. */
static nvmlReturn_t no_mps_processes(nvmlDevice_t device, unsigned int *count) {
    nvmlReturn_t ret;
    sim_state *state;
    if (!begin_device_call(device, &state, &ret)) return ret;
    if (!count) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    *count = 0;
    return end_info(state, NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                         void *infos) {
    (void)infos;
    return no_mps_processes(device, count);
}
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t device,
                                                            unsigned int *count, void *infos) {
    (void)infos;
    return no_mps_processes(device, count);
}
#ifndef SIM_OLD_DRIVER
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device,
                                                            unsigned int *count, void *infos) {
    (void)infos;
    return no_mps_processes(device, count);
}

/* The newer one-call list (mode 0 compute, 1 graphics, 2 MPS), with the same two-call size
 * protocol as the others. */
API nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device,
                                                       nvmlProcessDetailList_t *list) {
    nvmlProcessInfo_t *infos;
    unsigned int i, count;
    nvmlReturn_t ret;
    if (!list) return NVML_ERROR_INVALID_ARGUMENT;
    if (list->version != SIM_PROCESS_DETAIL_LIST_V1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (list->mode == 2) return no_mps_processes(device, &list->numProcArrayEntries);
    if (list->mode > 2) return NVML_ERROR_INVALID_ARGUMENT;
    count = list->procArray ? list->numProcArrayEntries : 0;
    infos = count ? calloc(count, sizeof *infos) : NULL;
    if (count && !infos) return NVML_ERROR_MEMORY;
    ret = list_processes(device, &count, infos, list->mode, sizeof *infos);
    list->numProcArrayEntries = count;
    for (i = 0; ret == NVML_SUCCESS && i < count; i++) {
        list->procArray[i].pid = infos[i].pid;
        list->procArray[i].usedGpuMemory = infos[i].usedGpuMemory;
        list->procArray[i].gpuInstanceId = infos[i].gpuInstanceId;
        list->procArray[i].computeInstanceId = infos[i].computeInstanceId;
        list->procArray[i].usedGpuCcProtectedMemory = 0;
    }
    free(infos);
    return ret;
}
#endif

/* Field values (NVLink, power...): each field says NOT_SUPPORTED, the call succeeds. */
API nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count,
                                          nvmlFieldValue_t *values) {
    nvmlReturn_t ret;
    sim_state *state;
    int i;
    if (!begin_info(device, &state, &ret)) return ret;
    if (count < 0 || (count > 0 && !values)) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    for (i = 0; i < count; i++) {
        values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        values[i].latencyUsec = 0;
        values[i].timestamp = 0;
        values[i].value = 0;
    }
    return end_info(state, NVML_SUCCESS);
}

/* MIG: the mode, the instances of a GPU in MIG mode (in the order of their GPU instance ids)
 * as devices of their own, and the way back from an instance to its GPU. */
API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current,
                                      unsigned int *pending) {
    nvmlReturn_t ret;
    sim_state *state;
    sim_gpu *gpu = begin_info(device, &state, &ret);
    if (!gpu) return ret;
    if (!current || !pending) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    *current = *pending = (unsigned int)gpu->mig;
    return end_info(state, NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                     nvmlDevice_t *mig) {
    nvmlReturn_t ret;
    sim_state *state;
    unsigned int gi, seen = 0;
    sim_gpu *gpu = begin_info(device, &state, &ret);
    if (!gpu) return ret;
    if (!mig) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    for (gi = 0; gpu->mig && gi < SIM_MAX_GI; gi++) {
        if (!find_mig(state, device->index, (int)gi)) continue;
        if (seen++ == index) {
            sim_mig_handles[device->index][gi].index = device->index;
            sim_mig_handles[device->index][gi].mig = (int)gi;
            *mig = &sim_mig_handles[device->index][gi];
            return end_info(state, NVML_SUCCESS);
        }
    }
    return end_info(state, NVML_ERROR_NOT_FOUND);
}

/* Begins a call that only a MIG instance's handle answers (NOT_SUPPORTED on a GPU's). */
static sim_gpu *begin_mig_call(nvmlDevice_t device, sim_state **state, nvmlReturn_t *ret) {
    sim_gpu *gpu = begin_device_call(device, state, ret);
    if (!gpu) return NULL;
    if ((*ret = sim_enter(state, CALL_INFO, (int)device->index)) != NVML_SUCCESS) return NULL;
    if (device->mig < 0) {
        release_state(*state);
        *state = NULL;
        *ret = NVML_ERROR_NOT_SUPPORTED;
        return NULL;
    }
    return gpu;
}

API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig,
                                                              nvmlDevice_t *device) {
    nvmlReturn_t ret;
    sim_state *state;
    if (!begin_mig_call(mig, &state, &ret))
        return ret == NVML_ERROR_NOT_SUPPORTED ? NVML_ERROR_INVALID_ARGUMENT : ret;
    if (!device) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    sim_handles[mig->index].index = mig->index;
    sim_handles[mig->index].mig = -1;
    *device = &sim_handles[mig->index];
    return end_info(state, NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    nvmlReturn_t ret;
    sim_state *state;
    if (!begin_mig_call(device, &state, &ret)) return ret;
    if (!id) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    *id = (unsigned int)device->mig;
    return end_info(state, NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    nvmlReturn_t ret;
    sim_state *state;
    if (!begin_mig_call(device, &state, &ret)) return ret;
    if (!id) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    *id = 0; /* one compute instance per GPU instance */
    return end_info(state, NVML_SUCCESS);
}
