/*
 * The NVML calls that other clients (nvitop, gpustat, nvidia-smi-like tools) make, and MIG.
 * Included by nvml_stub.c, after the calls it builds on.
 */

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

/* Whether procs[at] counts as a live process with a context on its GPU, compute or graphics,
 * once: a process on both lists counts by its compute listing (the parser allows one listing
 * per list, and graphics ones are few, so only they look further). */
static int first_listing(const sim_state *state, unsigned int at) {
    const sim_proc *proc = &state->procs[at];
    unsigned int i;
    if (proc_gone(proc)) return 0;
    if (!proc->graphics) return 1;
    for (i = 0; i < state->proc_count; i++) {
        const sim_proc *other = &state->procs[i];
        if (!other->graphics && other->gpu == proc->gpu && other->pid == proc->pid) return 0;
    }
    return 1;
}

/* The processes with a context on GPU `index`: what the driver samples utilization of. */
static unsigned int running_processes(const sim_state *state, unsigned int index) {
    unsigned int i, found = 0;
    for (i = 0; i < state->proc_count; i++)
        if (state->procs[i].gpu == index && first_listing(state, i)) found++;
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
        if (proc->gpu != device->index || !first_listing(state, i)) continue;
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

/* A 13-digit board serial, as an H100's or H200's (nvmlDeviceGetHandleBySerial finds it). */
static void serial_text(unsigned int index, char *text, size_t size) {
    snprintf(text, size, "16549220%05u", index);
}

API nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length) {
    nvmlReturn_t ret;
    sim_state *state;
    char text[32];
    if (!begin_info(device, &state, &ret)) return ret;
    serial_text(device->index, text, sizeof text);
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

typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount,
        sharedEncoderCount, sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount,
        computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

/* A MIG instance's engines, by its compute slices (1g, 2g, 3g, 4g, 7g), as an H100's MIG
 * profiles list them (recalled from NVIDIA's MIG user guide for the H100; not verified for an
 * H200): SMs, copy engines, NVDEC, NVJPG, OFA; no NVENC on either. */
static const unsigned int sim_mig_engines[8][5] = {
    {0, 0, 0, 0, 0}, {16, 1, 1, 1, 0}, {32, 2, 2, 2, 0}, {60, 3, 3, 3, 0},
    {64, 4, 4, 4, 0}, {64, 4, 4, 4, 0}, {64, 4, 4, 4, 0}, {132, 8, 7, 7, 1}};

/* The instance's compute slices: the "Ng." of its profile name (NVIDIA H200 MIG 3g.71gb),
 * else from its share of the GPU's memory, in eighths (1/8: 1g, 2/8: 2g, 4/8: 3g, 8/8: 7g). */
static unsigned int mig_slices(const sim_mig *mig, const sim_gpu *gpu) {
    const char *at = strstr(mig->name, "g.");
    unsigned long long eighths;
    if (at && at > mig->name && at[-1] >= '1' && at[-1] <= '7' &&
        (at - 1 == mig->name || at[-2] == ' '))
        return (unsigned int)(at[-1] - '0');
    eighths = gpu->total ? (mig->total * 8 + gpu->total / 2) / gpu->total : 0;
    return eighths >= 8 ? 7 : eighths >= 4 ? 3 : eighths >= 2 ? 2 : 1;
}

/* What nvml.h says it is for: a MIG device handle's engines and memory; a GPU's handle gets
 * NOT_SUPPORTED ("currently only supports MIG device handles"). */
API nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *out) {
    nvmlReturn_t ret;
    sim_state *state;
    const sim_mig *mig;
    const unsigned int *engines;
    unsigned int slices;
    sim_gpu *gpu = begin_mig_call(device, &state, &ret);
    if (!gpu) return ret;
    if (!out) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    mig = find_mig(state, device->index, device->mig);
    slices = mig_slices(mig, gpu);
    engines = sim_mig_engines[slices];
    out->multiprocessorCount = engines[0];
    out->sharedCopyEngineCount = engines[1];
    out->sharedDecoderCount = engines[2];
    out->sharedEncoderCount = 0;
    out->sharedJpegCount = engines[3];
    out->sharedOfaCount = engines[4];
    out->gpuInstanceSliceCount = out->computeInstanceSliceCount = slices;
    out->memorySizeMB = mig->total >> 20;
    return end_info(state, NVML_SUCCESS);
}
API nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t device, nvmlDeviceAttributes_t *out) {
    return nvmlDeviceGetAttributes_v2(device, out);
}
