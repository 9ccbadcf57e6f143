/*
 * The simulated GPU's state: its parser (the rules of jax_nbmem/simgpu/state_format.py, read in
 * Python by state_parse.py; the tests hold both readers to them), the state in use (read until
 * two reads agree, parsed once per change, shared by every thread; a file whose stat has not
 * changed is not read again, as a driver answers from memory), and its canonical text. The file
 * is opened without following a link or blocking, and only a regular file of bounded size is
 * read: anything else is a said fault (NVML_ERROR_NO_PERMISSION), never a hang.
 * Included by nvml_stub.c, after its types.
 */

/* ------------------------------------------------------------------------------------------ */
/* The parser: one line at a time, the first problem wins (state_parse.py: the same rules). */

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

/* A proc line's KEY= tokens after its PID. */
enum { PROC_USED, PROC_KIND, PROC_ENDS, PROC_MIG, PROC_PIDNS, PROC_START, PROC_KEYS };
static const struct { const char *key; size_t length; } sim_proc_keys[PROC_KEYS] = {
    {"used=", 5}, {"kind=", 5}, {"ends=", 5}, {"mig=", 4}, {"pidns=", 6}, {"start=", 6},
};

/* Each proc key's value among tokens[3:], the last one given (find_key's answer, found in one
 * pass: a state of 8 GPUs x 200 processes has 1,600 proc lines, parsed at every rewrite);
 * NULL where a key is absent. No key is another's prefix, and each starts with its own letter. */
static void proc_keys(const sim_token *tokens, size_t count, sim_token values[PROC_KEYS],
                      const sim_token *found[PROC_KEYS]) {
    size_t i;
    int key;
    for (key = 0; key < PROC_KEYS; key++) found[key] = NULL;
    for (i = 3; i < count; i++) {
        for (key = 0; key < PROC_KEYS; key++) {
            size_t n = sim_proc_keys[key].length;
            if (tokens[i].length >= n && tokens[i].start[0] == sim_proc_keys[key].key[0] &&
                memcmp(tokens[i].start, sim_proc_keys[key].key, n) == 0) {
                values[key].start = tokens[i].start + n;
                values[key].length = tokens[i].length - n;
                found[key] = &values[key];
                break;
            }
        }
    }
}

static void parse_proc(sim_state *state, sim_parse *parse, unsigned int line, sim_token *tokens,
                       size_t count) {
    unsigned int gpu;
    unsigned long long pid, used;
    sim_token values[PROC_KEYS], found;
    const sim_token *given[PROC_KEYS];
    sim_proc *proc;
    int graphics = 0, ends = 0, mig = -1;
    unsigned long long pidns = 0, start = 0;
    int start_given = 0;
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
    proc_keys(tokens, count, values, given);
    if (!given[PROC_USED]) {
        problem_at(parse, line, "proc: missing used=");
        return;
    }
    if (!bytes_value(parse, line, "proc", "used=", given[PROC_USED], 1, &used)) return;
    if (given[PROC_KIND]) {
        found = *given[PROC_KIND];
        if (found.length == 8 && memcmp(found.start, "graphics", 8) == 0) {
            graphics = 1;
        } else if (!(found.length == 7 && memcmp(found.start, "compute", 7) == 0)) {
            problem_at(parse, line, "proc: bad kind= '%s'", token_text(&found, text, sizeof text));
            return;
        }
    }
    if (given[PROC_ENDS]) {
        found = *given[PROC_ENDS];
        if (!(found.length == 4 && memcmp(found.start, "exit", 4) == 0)) {
            problem_at(parse, line, "proc: bad ends= '%s'", token_text(&found, text, sizeof text));
            return;
        }
        ends = 1;
    }
    if (given[PROC_MIG]) {
        unsigned long long gi;
        found = *given[PROC_MIG];
        if (!parse_u64(found.start, found.length, &gi) || gi >= SIM_MAX_GI) {
            problem_at(parse, line, "proc: bad mig= '%s'", token_text(&found, text, sizeof text));
            return;
        }
        mig = (int)gi;
    }
    if (given[PROC_PIDNS]) {
        found = *given[PROC_PIDNS];
        if (!parse_u64(found.start, found.length, &pidns) || !pidns || pidns == SIM_NOT_AVAILABLE) {
            problem_at(parse, line, "proc: bad pidns= '%s'", token_text(&found, text, sizeof text));
            return;
        }
    }
    if (given[PROC_START]) {
        found = *given[PROC_START];
        if (!parse_u64(found.start, found.length, &start) || start == SIM_NOT_AVAILABLE) {
            problem_at(parse, line, "proc: bad start= '%s'", token_text(&found, text, sizeof text));
            return;
        }
        start_given = 1;
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
    proc->pidns = pidns;
    proc->start = start;
    proc->start_given = start_given;
    proc->twin_before = 0; /* check_state marks the twins; realloc'd memory holds anything */
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
    if (strcmp(word, "proc") == 0) { /* first: most lines are */
        parse_proc(state, parse, line, tokens, count);
    } else if (strcmp(word, "end") == 0) {
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
    /* Writers list a GPU's processes in order (SimState does): sorted already, left so. */
    for (i = 1; i < state->proc_count && by_gpu_pid_line(&order[i - 1], &order[i]) < 0; i++)
        ;
    if (i < state->proc_count) qsort(order, state->proc_count, sizeof *order, by_gpu_pid_line);
    for (i = 1; i < state->proc_count; i++) {
        const sim_proc *first = order[i - 1];
        sim_proc *proc = order[i];
        unsigned int j;
        if (proc->gpu != first->gpu || proc->pid != first->pid) continue;
        proc->twin_before = 1; /* an earlier line holds this PID on this GPU (device_used) */
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
    free(state->by_gpu);
    free(state->procs);
    free(state->path);
    free(state->text);
    free(state);
}

/* Each whole GPU's lines in the file's order (a counting sort); none where memory runs out:
 * then every call walks every line, as before the index. */
static void index_by_gpu(sim_state *state) {
    unsigned int counts[SIM_MAX_GPUS + 1] = {0}, next[SIM_MAX_GPUS], i, gpu;
    state->by_gpu = NULL;
    if (!state->proc_count) return;
    for (i = 0; i < state->proc_count; i++) {
        if (state->procs[i].gpu >= SIM_MAX_GPUS) return; /* parse_proc never lets one by */
        counts[state->procs[i].gpu + 1]++;
    }
    for (gpu = 0; gpu < SIM_MAX_GPUS; gpu++) counts[gpu + 1] += counts[gpu];
    if (!(state->by_gpu = malloc(state->proc_count * sizeof *state->by_gpu))) return;
    memcpy(state->gpu_first, counts, sizeof state->gpu_first);
    memcpy(next, counts, sizeof next);
    for (i = 0; i < state->proc_count; i++) state->by_gpu[next[state->procs[i].gpu]++] = i;
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

static unsigned long long device_used(const sim_state *state, unsigned int index, int mig);

/* Works out once the used bytes of every GPU whose figure cannot change until the next parse:
 * none of its lines ends when its process exits. One pass over the lines for every GPU (what
 * device_used counts for one GPU, where no line has ended): a node of 8 GPUs x 200 processes
 * is rewritten every 100 ms by the benchmarks, and a driver answers from memory. */
static void fix_used(sim_state *state) {
    unsigned char moment[SIM_MAX_GPUS] = {0};
    unsigned long long sum[SIM_MAX_GPUS] = {0};
    unsigned int i, j;
    for (i = 0; i < state->proc_count; i++) {
        if (state->procs[i].ends_with_exit) moment[state->procs[i].gpu] = 1;
    }
    for (i = 0; i < state->proc_count; i++) {
        const sim_proc *proc = &state->procs[i];
        if (moment[proc->gpu] || proc->used == SIM_NOT_AVAILABLE) continue;
        if (proc->twin_before) { /* on both lists: held once, counted at its first line */
            for (j = 0; j < i; j++) {
                if (state->procs[j].gpu == proc->gpu && state->procs[j].pid == proc->pid) break;
            }
            if (j < i) continue;
        }
        sum[proc->gpu] += proc->used;
    }
    for (i = 0; i < SIM_MAX_GPUS; i++) {
        const sim_gpu *gpu = &state->gpus[i];
        if (!gpu->present || moment[i]) continue;
        if (gpu->used_given)
            state->used_known[i] = device_used(state, i, -1);
        else
            state->used_known[i] = sum[i] > gpu->total ? gpu->total : sum[i];
        state->used_fixed[i] = 1;
    }
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
    fix_used(state);
    index_by_gpu(state);
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

#include "nvml_file.c"

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
    sim_identity seen = {0};
    long long began;
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
        if (still_current(use, path)) {
            *ret = NVML_SUCCESS;
            return use;
        }
        release_state(use);
        use = NULL;
    }
    began = now_ns();
    got = read_stable(path, &text, &length, &seen);
    if (got == READ_REFUSED) {
        pthread_mutex_lock(&sim_lock);
        say_refused(path);
        pthread_mutex_unlock(&sim_lock);
        *ret = NVML_ERROR_NO_PERMISSION;
        return NULL;
    }
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
        sim_good->seen = seen;
        sim_good->trusted = read_settles(began, seen.mtime_ns);
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
            parsed->seen = seen;
            parsed->trusted = read_settles(began, seen.mtime_ns);
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
        put(out, "%s", proc->ends_with_exit ? " ends=exit" : "");
        if (proc->start_given) put(out, " start=%llu", proc->start);
        if (proc->pidns) put(out, " pidns=%llu", proc->pidns);
        put(out, "\n");
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

/* Parses TEXT as a state file; 0 and its canonical text in OUT (after KEEP, when given, has
 * changed the parsed state), or 1 and the problem. OUT is always NUL-terminated (cut short when
 * LENGTH is too small). */
static int render_checked(const char *text, char *out, unsigned int length,
                          void (*keep)(sim_state *)) {
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
    if (keep) keep(state);
    render_state(state, &rendered);
    out[length - 1] = '\0';
    free_state(state);
    return 0;
}

/* Not NVML: parses TEXT as a state file; 0 and its canonical text in OUT, or 1 and the
 * problem. OUT is always NUL-terminated (cut short when LENGTH is too small). */
API int jaxNbmemSimCheck(const char *text, char *out, unsigned int length) {
    return render_checked(text, out, length, NULL);
}
