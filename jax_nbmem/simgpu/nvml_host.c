/*
 * Where the simulated GPUs sit and what the host says of them: CPU and memory affinity (this
 * host's real NUMA nodes), NVLink, a GPU found by its serial, the names of the processes on it,
 * the energy it has used. Included by nvml_query.c.
 */

#define SIM_CPULIST 4096

/* GPU `index`'s NUMA node on a host with `nodes` of them: GPUs 0-3 of an HGX board on the
 * first node and 4-7 on the second (not verified: boards are wired either way). */
static unsigned int gpu_node(unsigned int index, unsigned int nodes) {
    return nodes > 1 ? (index % 8) * nodes / 8 : 0;
}

/* The host's NUMA nodes (0 when it shows none). */
static unsigned int node_count(void) {
    char path[64];
    unsigned int nodes = 0;
    while (nodes < SIM_MAX_NODES) {
        snprintf(path, sizeof path, "/sys/devices/system/node/node%u", nodes);
        if (access(path, F_OK) != 0) break;
        nodes++;
    }
    return nodes;
}

/* Sets the bits of a kernel CPU list ("0-3,8-11") in `set` (`words` 64-bit words); 0 when read. */
static int read_cpulist(const char *path, unsigned long *set, unsigned int words) {
    char text[SIM_CPULIST];
    const char *at = text;
    FILE *file = fopen(path, "r");
    size_t got;
    if (!file) return -1;
    got = fread(text, 1, sizeof text - 1, file);
    fclose(file);
    text[got] = '\0';
    memset(set, 0, words * sizeof *set);
    while (isdigit((unsigned char)*at)) {
        char *end;
        unsigned long first = strtoul(at, &end, 10), last = first, cpu;
        if (*end == '-') last = strtoul(end + 1, &end, 10);
        for (cpu = first; cpu <= last && cpu / 64 < words; cpu++)
            set[cpu / 64] |= 1UL << (cpu % 64);
        at = *end == ',' ? end + 1 : end;
    }
    return 0;
}

/* The CPUs nearest GPU `index`: its NUMA node's (NODE and SOCKET scope alike: one socket, one
 * node, as on an HGX host), or every online CPU on a host without NUMA nodes. */
static nvmlReturn_t cpu_affinity(nvmlDevice_t device, unsigned int words, unsigned long *set,
                                 int scope) {
    nvmlReturn_t ret;
    sim_state *state;
    char path[80];
    unsigned int nodes = node_count();
    if (!begin_info(device, &state, &ret)) return ret;
    if (!set || words == 0 || scope < 0 || scope > 1)
        return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    snprintf(path, sizeof path, "/sys/devices/system/node/node%u/cpulist",
             gpu_node(device->index, nodes));
    if (nodes && read_cpulist(path, set, words) == 0) return end_info(state, NVML_SUCCESS);
    if (read_cpulist("/sys/devices/system/cpu/online", set, words) == 0)
        return end_info(state, NVML_SUCCESS);
    return end_info(state, NVML_ERROR_UNKNOWN);
}

API nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int words,
                                          unsigned long *set) {
    return cpu_affinity(device, words, set, 0);
}
API nvmlReturn_t nvmlDeviceGetCpuAffinityWithinScope(nvmlDevice_t device, unsigned int words,
                                                     unsigned long *set, int scope) {
    return cpu_affinity(device, words, set, scope);
}

API nvmlReturn_t nvmlDeviceGetMemoryAffinity(nvmlDevice_t device, unsigned int words,
                                             unsigned long *set, int scope) {
    nvmlReturn_t ret;
    sim_state *state;
    unsigned int node = gpu_node(device->index, node_count());
    if (!begin_info(device, &state, &ret)) return ret;
    if (!set || words == 0 || scope < 0 || scope > 1)
        return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    memset(set, 0, words * sizeof *set);
    if (node / 64 < words) set[node / 64] = 1UL << (node % 64);
    return end_info(state, NVML_SUCCESS);
}

/* The GPU whose board serial is `serial` (nvmlDeviceGetSerial's). */
API nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device) {
    nvmlReturn_t ret;
    sim_state *state = begin_call(&ret);
    unsigned int i;
    char text[32];
    if (!state) return ret;
    if (!serial || !device) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    for (i = 0; i < SIM_MAX_GPUS; i++) {
        if (!state->gpus[i].present) continue;
        serial_text(i, text, sizeof text);
        if (strcmp(serial, text) != 0) continue;
        if (state->lost[i]) return end_info(state, NVML_ERROR_GPU_IS_LOST);
        sim_handles[i].index = i;
        sim_handles[i].mig = -1;
        *device = &sim_handles[i];
        return end_info(state, NVML_SUCCESS);
    }
    return end_info(state, NVML_ERROR_NOT_FOUND);
}

/* A process's name as nvidia-smi shows it: its command's first word, as the process gave it
 * (/proc/PID/cmdline), else its short name (/proc/PID/comm: a process that cleared its
 * command line; not verified). NOT_FOUND when no such process runs (nvml.h); a name longer
 * than `length` is cut (not verified). */
API nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length) {
    nvmlReturn_t ret;
    sim_state *state = begin_call(&ret);
    char path[64], text[1024];
    size_t got = 0;
    FILE *file;
    if (!state) return ret;
    if (!name || length == 0) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    snprintf(path, sizeof path, "/proc/%u/cmdline", pid);
    if ((file = fopen(path, "r")) != NULL) {
        got = fread(text, 1, sizeof text - 1, file);
        fclose(file);
    }
    text[got] = '\0';
    if (text[0] == '\0') {
        snprintf(path, sizeof path, "/proc/%u/comm", pid);
        if ((file = fopen(path, "r")) == NULL) return end_info(state, NVML_ERROR_NOT_FOUND);
        got = fread(text, 1, sizeof text - 1, file);
        fclose(file);
        text[got] = '\0';
        text[strcspn(text, "\n")] = '\0';
    }
    strncpy(name, text, length - 1);
    name[length - 1] = '\0';
    return end_info(state, NVML_SUCCESS);
}

/* Energy since the driver loaded, in millijoules: as if the GPU had idled since the host
 * booted, then the power it draws (nvml_clients.c's figure, which follows the state) summed
 * over time from this process's first question. It never goes back, and grows between any two
 * questions a millisecond apart. */
static pthread_mutex_t sim_energy_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int started;
    double millijoules;
    struct timespec last;
} sim_energy[SIM_MAX_GPUS];

static double seconds_between(const struct timespec *from, const struct timespec *to) {
    return (double)(to->tv_sec - from->tv_sec) + (double)(to->tv_nsec - from->tv_nsec) / 1e9;
}

API nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device,
                                                     unsigned long long *millijoules) {
    nvmlReturn_t ret;
    sim_state *state;
    struct timespec now, boot;
    unsigned int milliwatts;
    sim_gpu *gpu = begin_info(device, &state, &ret);
    if (!gpu) return ret;
    if (!millijoules) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    milliwatts = figure_power(state, gpu, device->index);
    clock_gettime(CLOCK_MONOTONIC, &now);
    pthread_mutex_lock(&sim_energy_lock);
    if (!sim_energy[device->index].started) {
        clock_gettime(CLOCK_BOOTTIME, &boot);
        sim_energy[device->index].started = 1;
        sim_energy[device->index].millijoules = seconds_between(&(struct timespec){0, 0}, &boot) *
                                                SIM_IDLE_POWER_MW;
    } else {
        sim_energy[device->index].millijoules +=
            milliwatts * seconds_between(&sim_energy[device->index].last, &now);
    }
    sim_energy[device->index].last = now;
    *millijoules = (unsigned long long)sim_energy[device->index].millijoules;
    pthread_mutex_unlock(&sim_energy_lock);
    return end_info(state, NVML_SUCCESS);
}

/* NVLink: an H200 SXM's 18 links (NVIDIA's datasheet), NVLink 4 (NVML_NVLINK_VERSION_4_0), each
 * up, to the board's NVSwitches. What each link can do (by NVML_NVLINK_CAP_*): peer-to-peer and
 * its atomics, no system memory over NVLink on an x86 host, no SLI bridge, valid (not
 * verified). A link past the 18th is INVALID_ARGUMENT, the code nvml.h gives an invalid link
 * (not verified). */
static nvmlReturn_t nvlink_figure(nvmlDevice_t device, unsigned int link, unsigned int what,
                                  unsigned int *out) {
    static const unsigned int capabilities[6] = {1, 0, 1, 0, 0, 1};
    nvmlReturn_t ret;
    sim_state *state;
    if (!begin_info(device, &state, &ret)) return ret;
    if (!out || link >= SIM_NVLINKS || what > 7)
        return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    *out = what < 6 ? capabilities[what] : what == 6 ? SIM_NVLINK_VERSION_4_0 : 1;
    return end_info(state, NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int link,
                                               int capability, unsigned int *result) {
    if (capability < 0 || capability > 5) return NVML_ERROR_INVALID_ARGUMENT;
    return nvlink_figure(device, link, (unsigned int)capability, result);
}
API nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link,
                                            unsigned int *version) {
    return nvlink_figure(device, link, 6, version);
}
API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                          int *active) {
    return nvlink_figure(device, link, 7, (unsigned int *)active);
}

/* Peer to peer between two GPUs of the board, by NVML_P2P_CAPS_INDEX_* (read, write, NVLink,
 * atomics, PCI): OK, through the NVSwitches, as `nvidia-smi topo -p2p` shows for an HGX board
 * (published, H100). An index past those gets NVML_P2P_STATUS_UNKNOWN, and a GPU asked about
 * itself INVALID_ARGUMENT (both not verified). */
API nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device, nvmlDevice_t peer, int index,
                                        int *status) {
    nvmlReturn_t ret;
    sim_state *state, *peer_state;
    if (!begin_info(peer, &peer_state, &ret)) return ret;
    release_state(peer_state);
    if (!begin_info(device, &state, &ret)) return ret;
    if (!status || index < 0 || peer->index == device->index)
        return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    *status = index <= 4 ? 0 : 6; /* NVML_P2P_STATUS_OK, NVML_P2P_STATUS_UNKNOWN */
    return end_info(state, NVML_SUCCESS);
}
