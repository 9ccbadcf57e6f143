/*
 * What `nvidia-smi -q` asks, and the Python tools that redo it (pynvml_utils' DeviceQuery and
 * XmlDeviceQuery), and a few calls around them: brand, board, inforom, ECC, PCIe link, clocks and
 * their event reasons, temperature thresholds, power limits, energy, CPU and memory affinity,
 * process names, NVLink. Included by nvml_stub.c after nvml_clients.c, whose calls it uses.
 *
 * The figures are an H200 SXM's. Where each comes from:
 *  - enum values (brand, P-states, NVLink version, thresholds' kinds): nvidia-ml-py's pynvml.py,
 *    which copies nvml.h;
 *  - "published": what `nvidia-smi -q` printed for an H100 or H200 SXM in output that users
 *    posted (no network here: recalled, so each such value says which GPU it was seen on);
 *  - "not verified": no such source confirms it; the value is plausible, and said to be a guess.
 * docs/getting-started.md ("Try it without a GPU") lists the same.
 *
 * Every call goes through begin_info: a MIG instance's handle gets NOT_SUPPORTED, a lost GPU
 * GPU_IS_LOST, and `fail info` / `slow info` reach them all.
 */

#define SIM_BRAND_NVIDIA 14          /* NVML_BRAND_NVIDIA; nvidia-smi: "Product Brand: NVIDIA" */
#define SIM_PSTATE 0                 /* published (H100, H200): P0, idle or busy */
#define SIM_MIN_POWER_LIMIT_MW 200000u /* published (H100 SXM), not verified for an H200 */
#define SIM_ACCOUNTING_BUFFER 4000u  /* published (H100), not verified for an H200 */
#define SIM_PCIE_GEN 5               /* published (H100 SXM): Gen 5 */
#define SIM_PCIE_WIDTH 16            /* published (H100 SXM): 16x */
#define SIM_NVLINKS 18               /* an H200 SXM has 18 NVLink 4 links (NVIDIA's datasheet) */
#define SIM_NVLINK_VERSION_4_0 6     /* NVML_NVLINK_VERSION_4_0 */
#define SIM_MEMORY_CLOCK_MHZ 3201u   /* HBM3e; the same figure nvml_clients.c's clocks use */
#define SIM_GRAPHICS_MAX_MHZ 1980u
#define SIM_GRAPHICS_MIN_MHZ 345u
#define SIM_GRAPHICS_STEP_MHZ 15u    /* not verified: the supported graphics clocks' step */
#define SIM_EVENT_GPU_IDLE 0x1ULL    /* nvmlClocksEventReasonGpuIdle */
#define SIM_EVENT_SUPPORTED 0x1FFULL /* not verified: the nine reasons nvidia-smi -q lists */
#define SIM_MAX_NODES 64

/* Whether the GPU has nothing to do: no context on it, no utilization. */
static int gpu_idle(const sim_state *state, const sim_gpu *gpu, unsigned int index) {
    return gpu_util(gpu) == 0 && running_processes(state, index) == 0;
}

static unsigned int figure_brand(const sim_state *s, const sim_gpu *g, unsigned int i) {
    (void)s, (void)g, (void)i;
    return SIM_BRAND_NVIDIA;
}
static unsigned int figure_pstate(const sim_state *s, const sim_gpu *g, unsigned int i) {
    (void)s, (void)g, (void)i;
    return SIM_PSTATE;
}
/* Published (H100 SXM, bus 0x1B: "Board ID: 0x1b00"), not verified for an H200: the bus number,
 * shifted. */
static unsigned int figure_board_id(const sim_state *s, const sim_gpu *g, unsigned int i) {
    (void)s, (void)g;
    return pci_bus(i) << 8;
}
static unsigned int figure_accounting_buffer(const sim_state *s, const sim_gpu *g,
                                             unsigned int i) {
    (void)s, (void)g, (void)i;
    return SIM_ACCOUNTING_BUFFER;
}
static unsigned int figure_pcie_gen(const sim_state *s, const sim_gpu *g, unsigned int i) {
    (void)s, (void)g, (void)i;
    return SIM_PCIE_GEN;
}
static unsigned int figure_pcie_width(const sim_state *s, const sim_gpu *g, unsigned int i) {
    (void)s, (void)g, (void)i;
    return SIM_PCIE_WIDTH;
}

API nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, int *brand) {
    return device_figure(device, (unsigned int *)brand, figure_brand);
}
/* nvidia-smi's "Performance State"; the same P-state as nvmlDeviceGetPerformanceState. */
API nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t device, int *pstate) {
    return device_figure(device, (unsigned int *)pstate, figure_pstate);
}
API nvmlReturn_t nvmlDeviceGetMultiGpuBoard(nvmlDevice_t device, unsigned int *multi) {
    return device_figure(device, multi, figure_zero); /* published (H100 SXM): "No" */
}
API nvmlReturn_t nvmlDeviceGetBoardId(nvmlDevice_t device, unsigned int *board) {
    return device_figure(device, board, figure_board_id);
}
API nvmlReturn_t nvmlDeviceGetAccountingMode(nvmlDevice_t device, int *mode) {
    return device_figure(device, (unsigned int *)mode, figure_zero); /* published: Disabled */
}
API nvmlReturn_t nvmlDeviceGetAccountingBufferSize(nvmlDevice_t device, unsigned int *size) {
    return device_figure(device, size, figure_accounting_buffer);
}
API nvmlReturn_t nvmlDeviceGetPowerManagementMode(nvmlDevice_t device, int *mode) {
    return device_figure(device, (unsigned int *)mode, figure_one); /* "Supported" */
}
API nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen) {
    return device_figure(device, gen, figure_pcie_gen);
}
/* not verified: an idle GPU may train its link down; this one stays at Gen 5. */
API nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen) {
    return device_figure(device, gen, figure_pcie_gen);
}
API nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *width) {
    return device_figure(device, width, figure_pcie_width);
}
API nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *width) {
    return device_figure(device, width, figure_pcie_width);
}
API nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *count) {
    return device_figure(device, count, figure_zero);
}

/* Published (H100 SXM): "N/A" for each of these on a datacenter GPU under Linux. Accounting is
 * off, so its process lists are NOT_SUPPORTED too (nvml.h); Hopper remaps rows instead of
 * retiring pages; an SXM board has no bridge chip. */
API nvmlReturn_t nvmlDeviceGetGpuOperationMode(nvmlDevice_t device, int *current, int *pending) {
    (void)current, (void)pending;
    return not_supported(device);
}
API nvmlReturn_t nvmlDeviceGetAutoBoostedClocksEnabled(nvmlDevice_t device, int *enabled,
                                                       int *by_default) {
    (void)enabled, (void)by_default;
    return not_supported(device);
}
API nvmlReturn_t nvmlDeviceGetAccountingPids(nvmlDevice_t device, unsigned int *count,
                                             unsigned int *pids) {
    (void)count, (void)pids;
    return not_supported(device);
}
API nvmlReturn_t nvmlDeviceGetAccountingStats(nvmlDevice_t device, unsigned int pid, void *stats) {
    (void)pid, (void)stats;
    return not_supported(device);
}
API nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, int cause, unsigned int *count,
                                           void *pages) {
    (void)cause, (void)count, (void)pages;
    return not_supported(device);
}
API nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, int cause,
                                              unsigned int *count, void *pages,
                                              void *timestamps) {
    (void)cause, (void)count, (void)pages, (void)timestamps;
    return not_supported(device);
}
API nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, int *pending) {
    (void)pending;
    return not_supported(device);
}
API nvmlReturn_t nvmlDeviceGetBridgeChipInfo(nvmlDevice_t device, void *hierarchy) {
    (void)hierarchy;
    return not_supported(device);
}

static nvmlReturn_t device_text(nvmlDevice_t device, char *out, unsigned int length,
                                const char *text) {
    nvmlReturn_t ret;
    sim_state *state;
    if (!begin_info(device, &state, &ret)) return ret;
    return end_info(state, copy_string(out, length, text));
}

API nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char *version,
                                           unsigned int length) {
    return device_text(device, version, length, "96.00.A5.00.01"); /* not verified */
}
API nvmlReturn_t nvmlDeviceGetInforomImageVersion(nvmlDevice_t device, char *version,
                                                  unsigned int length) {
    return device_text(device, version, length, "G520.0200.00.05"); /* not verified */
}

/* Objects OEM, ECC, power (NVML_INFOROM_*). Published (H100 SXM): "2.1", "7.16", "N/A"; not
 * verified for an H200. */
API nvmlReturn_t nvmlDeviceGetInforomVersion(nvmlDevice_t device, int object, char *version,
                                             unsigned int length) {
    static const char *const versions[2] = {"2.1", "7.16"};
    if (object < 0 || object > 3) return NVML_ERROR_INVALID_ARGUMENT;
    if (object >= 2) return not_supported(device);
    return device_text(device, version, length, versions[object]);
}

/* ECC: on (published, H100 and H200), and no error has been counted. Errors are counted where
 * Hopper counts them, in DRAM and SRAM (nvidia-smi -q's rows); the older locations (L1, L2,
 * register file, texture) are NOT_SUPPORTED (not verified). */
API nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, int *current, int *pending) {
    nvmlReturn_t ret;
    sim_state *state;
    if (!begin_info(device, &state, &ret)) return ret;
    if (!current || !pending) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    *current = *pending = 1;
    return end_info(state, NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t device, int error_type,
                                                 int counter_type, int location,
                                                 unsigned long long *count) {
    nvmlReturn_t ret;
    sim_state *state;
    if (!begin_info(device, &state, &ret)) return ret;
    if (!count || error_type < 0 || error_type > 1 || counter_type < 0 || counter_type > 1 ||
        location < 0 || location > 7)
        return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    if (location != 2 && location != 7) return end_info(state, NVML_ERROR_NOT_SUPPORTED);
    *count = 0;
    return end_info(state, NVML_SUCCESS);
}

/* Thresholds in C, by NVML_TEMPERATURE_THRESHOLD_*: shutdown, slowdown, memory max, GPU max.
 * Published for an H100 SXM (92, 89, 95, 87); not verified for an H200. An SXM board has no
 * acoustic or GPS thresholds: NOT_SUPPORTED. */
API nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, int threshold,
                                                   unsigned int *temp) {
    static const unsigned int thresholds[4] = {92, 89, 95, 87};
    nvmlReturn_t ret;
    sim_state *state;
    if (!begin_info(device, &state, &ret)) return ret;
    if (!temp || threshold < 0 || threshold >= 8)
        return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    if (threshold >= 4) return end_info(state, NVML_ERROR_NOT_SUPPORTED);
    *temp = thresholds[threshold];
    return end_info(state, NVML_SUCCESS);
}

/* Published (H100 SXM): "Min Power Limit: 200.00 W", "Max Power Limit: 700.00 W". */
API nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device,
                                                              unsigned int *min_mw,
                                                              unsigned int *max_mw) {
    nvmlReturn_t ret;
    sim_state *state;
    if (!begin_info(device, &state, &ret)) return ret;
    if (!min_mw || !max_mw) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    *min_mw = SIM_MIN_POWER_LIMIT_MW;
    *max_mw = SIM_POWER_LIMIT_MW;
    return end_info(state, NVML_SUCCESS);
}

/* Applications clocks: the defaults, which are the maximum clocks (published, H100 SXM:
 * 1980 MHz graphics; the memory clock is the H200's HBM3e one). */
API nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t device, int type,
                                                unsigned int *mhz) {
    return nvmlDeviceGetMaxClockInfo(device, type, mhz);
}
API nvmlReturn_t nvmlDeviceGetDefaultApplicationsClock(nvmlDevice_t device, int type,
                                                       unsigned int *mhz) {
    return nvmlDeviceGetMaxClockInfo(device, type, mhz);
}

/* NVML's two-call protocol for a list of clocks: too small a buffer gets INSUFFICIENT_SIZE
 * and the count. */
static nvmlReturn_t clock_list(sim_state *state, unsigned int *count, unsigned int *clocks,
                               unsigned int top, unsigned int bottom, unsigned int step) {
    unsigned int n = (top - bottom) / step + 1, i;
    if (!count) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    if (*count < n || !clocks) {
        *count = n;
        return end_info(state, NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (i = 0; i < n; i++) clocks[i] = top - i * step;
    *count = n;
    return end_info(state, NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetSupportedMemoryClocks(nvmlDevice_t device, unsigned int *count,
                                                    unsigned int *clocks) {
    nvmlReturn_t ret;
    sim_state *state;
    if (!begin_info(device, &state, &ret)) return ret;
    return clock_list(state, count, clocks, SIM_MEMORY_CLOCK_MHZ, SIM_MEMORY_CLOCK_MHZ, 1);
}

API nvmlReturn_t nvmlDeviceGetSupportedGraphicsClocks(nvmlDevice_t device, unsigned int memory,
                                                      unsigned int *count,
                                                      unsigned int *clocks) {
    nvmlReturn_t ret;
    sim_state *state;
    if (!begin_info(device, &state, &ret)) return ret;
    if (memory != SIM_MEMORY_CLOCK_MHZ) return end_info(state, NVML_ERROR_NOT_FOUND); /* nvml.h */
    return clock_list(state, count, clocks, SIM_GRAPHICS_MAX_MHZ, SIM_GRAPHICS_MIN_MHZ,
                      SIM_GRAPHICS_STEP_MHZ);
}

/* Why the clocks are where they are: an idle GPU says so (published, H100: "Idle: Active");
 * a working one is held back by nothing. */
static nvmlReturn_t event_reasons(nvmlDevice_t device, unsigned long long *reasons,
                                  int supported) {
    nvmlReturn_t ret;
    sim_state *state;
    sim_gpu *gpu = begin_info(device, &state, &ret);
    if (!gpu) return ret;
    if (!reasons) return end_info(state, NVML_ERROR_INVALID_ARGUMENT);
    *reasons = supported                                  ? SIM_EVENT_SUPPORTED
               : gpu_idle(state, gpu, device->index) ? SIM_EVENT_GPU_IDLE
                                                         : 0;
    return end_info(state, NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                        unsigned long long *reasons) {
    return event_reasons(device, reasons, 0);
}
API nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t device,
                                                          unsigned long long *reasons) {
    return event_reasons(device, reasons, 1);
}
/* The names before NVML 12.2 (the same calls). */
API nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                           unsigned long long *reasons) {
    return event_reasons(device, reasons, 0);
}
API nvmlReturn_t nvmlDeviceGetSupportedClocksThrottleReasons(nvmlDevice_t device,
                                                             unsigned long long *reasons) {
    return event_reasons(device, reasons, 1);
}

#include "nvml_host.c"
