/*
 * The simulated GPU's state file, read as a driver would not have to: opened without following
 * a link or blocking, only a regular file of bounded size (anything else is a said fault, never
 * a hang: its folder may be anyone's), read until two reads agree, and looked at again only
 * when its stat changed. Included by nvml_state.c, after the state's lock.
 */

enum { READ_OK, READ_MISSING, READ_UNSTABLE, READ_NO_MEMORY, READ_REFUSED };

/* Why the last file was refused (READ_REFUSED), said once per path and reason. */
static __thread char sim_refused[SIM_PROBLEM]; /* each thread says its own */
static char sim_refused_said[SIM_PROBLEM];

static long long mtime_ns(const struct stat *info) {
    return (long long)info->st_mtim.tv_sec * 1000000000LL + info->st_mtim.tv_nsec;
}

/* How long after a file's mtime (MTIME ns) a read of it leaves its stat unproven (see
 * SIM_RACY_NS): two ticks of the coarse clock that stamps mtimes, never more than SIM_RACY_NS.
 * A write after a read at time t is stamped later than t - tick, so once t - mtime >= tick a
 * rewrite shows in the stat; the second tick is margin. At HZ=250 that is 8 ms, not 20: a
 * state rewritten every 100 ms (the benchmarks' moving neighbours) is compared text by text
 * for 8% of the time, not 20%. An mtime on a whole second is a filesystem that keeps seconds
 * (its tick is the second): two of those. */
static long long racy_ns(long long mtime) {
    static long long tick; /* the coarse clock's resolution, once found (any thread: same value) */
    long long found = __atomic_load_n(&tick, __ATOMIC_RELAXED);
    if (mtime % 1000000000LL == 0) return 2000000000LL;
    if (!found) {
        struct timespec resolution;
        found = SIM_RACY_NS / 2;
        if (clock_getres(CLOCK_REALTIME_COARSE, &resolution) == 0 && resolution.tv_sec == 0 &&
            resolution.tv_nsec > 0)
            found = resolution.tv_nsec;
        __atomic_store_n(&tick, found, __ATOMIC_RELAXED);
    }
    return 2 * found < SIM_RACY_NS ? 2 * found : SIM_RACY_NS;
}

/* Whether a read that began at BEGAN (ns) of a file whose mtime was MTIME makes its stat
 * proof: the same stat later, the same text (a state is then "trusted"). */
static int read_settles(long long began, long long mtime) {
    return began - mtime >= racy_ns(mtime);
}

static long long now_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
}

static void identify(const struct stat *info, sim_identity *id) {
    id->dev = info->st_dev;
    id->ino = info->st_ino;
    id->size = info->st_size;
    id->mtime_ns = mtime_ns(info);
}

static int same_identity(const sim_identity *a, const sim_identity *b) {
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime_ns == b->mtime_ns;
}

static const char *file_kind(mode_t mode) {
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISDIR(mode)) return "a directory";
    return "not a regular file";
}

/* Opens the state file for reading without ever waiting: never through a symbolic link (its
 * folder may be writable by anyone), without blocking (a FIFO put in its place would wait for
 * a writer forever, inside whatever process asks NVML, root's tools included), and only a
 * regular file of bounded size. -1 and READ_MISSING or READ_REFUSED (why, in sim_refused). */
static int open_state(const char *path, struct stat *info, int *why) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY);
    if (fd < 0) {
        *why = READ_MISSING;
        if (errno == ELOOP) {
            snprintf(sim_refused, sizeof sim_refused, "a symbolic link; refused");
            *why = READ_REFUSED;
        }
        return -1;
    }
    if (fstat(fd, info) != 0) {
        close(fd);
        *why = READ_MISSING;
        return -1;
    }
    if (!S_ISREG(info->st_mode) || info->st_size > (off_t)SIM_MAX_STATE_BYTES) {
        if (!S_ISREG(info->st_mode))
            snprintf(sim_refused, sizeof sim_refused, "%s, not a regular file; refused",
                     file_kind(info->st_mode));
        else
            snprintf(sim_refused, sizeof sim_refused,
                     "%lld bytes, more than a state can hold (%u); refused",
                     (long long)info->st_size, SIM_MAX_STATE_BYTES);
        close(fd);
        *why = READ_REFUSED;
        return -1;
    }
    return fd;
}

/* The whole file, in a buffer of its own (sized by fstat, grown if the file grows, never past
 * SIM_MAX_STATE_BYTES), and what stat said of it. */
static int read_text(const char *path, char **out, size_t *length, sim_identity *id) {
    struct stat info;
    size_t capacity, used = 0;
    ssize_t got;
    char *text;
    int why, fd = open_state(path, &info, &why);
    if (fd < 0) return why;
    identify(&info, id);
    capacity = info.st_size > 0 ? (size_t)info.st_size + 4096 : 65536;
    text = malloc(capacity + 1);
    while (text) {
        got = read(fd, text + used, capacity - used);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        used += (size_t)got;
        if (used > SIM_MAX_STATE_BYTES) {
            snprintf(sim_refused, sizeof sim_refused, "grew past %u bytes as it was read; refused",
                     SIM_MAX_STATE_BYTES);
            free(text);
            close(fd);
            return READ_REFUSED;
        }
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
static int read_stable(const char *path, char **out, size_t *length, sim_identity *id) {
    char *first = NULL, *second = NULL;
    size_t first_length = 0, second_length = 0;
    int tries, got = read_text(path, &first, &first_length, id);
    if (got != READ_OK) return got;
    for (tries = 0; tries < SIM_STABLE_READS; tries++) {
        if ((got = read_text(path, &second, &second_length, id)) != READ_OK) {
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

/* Whether the file holds exactly TEXT (LENGTH bytes); what stat said of it in *ID. */
static int file_matches(const char *path, const char *text, size_t length, sim_identity *id) {
    char chunk[16384];
    struct stat info;
    size_t seen = 0;
    ssize_t got;
    int why, fd = open_state(path, &info, &why), same = 0;
    if (fd < 0) return 0;
    identify(&info, id);
    if ((size_t)info.st_size == length) {
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

/* Whether STATE is still what the file at PATH holds, by a stat alone where that can tell
 * (see SIM_RACY_NS), else by comparing the text; remembers what it found. */
static int still_current(sim_state *state, const char *path) {
    struct stat info;
    sim_identity seen;
    long long began;
    int trusted, same;
    pthread_mutex_lock(&sim_lock);
    seen = state->seen;
    trusted = state->trusted;
    pthread_mutex_unlock(&sim_lock);
    if (lstat(path, &info) != 0 || !S_ISREG(info.st_mode)) return 0;
    if (trusted) {
        sim_identity now;
        identify(&info, &now);
        if (same_identity(&now, &seen)) return 1;
    }
    began = now_ns();
    same = file_matches(path, state->text, state->length, &seen);
    if (same) {
        pthread_mutex_lock(&sim_lock);
        state->seen = seen;
        state->trusted = read_settles(began, seen.mtime_ns);
        pthread_mutex_unlock(&sim_lock);
    }
    return same;
}

/* Says a refused file once (until the reason changes): never a hang, never silence. */
static void say_refused(const char *path) {
    if (strcmp(sim_refused, sim_refused_said) == 0) return;
    memcpy(sim_refused_said, sim_refused, sizeof sim_refused_said);
    fprintf(stderr, "jax_nbmem simulated GPU: %s: %s\n", path, sim_refused);
}
