/*
 * sim device profiles and link presets: the ONE table of hardware figures the timing model
 * uses (memory, HBM bandwidth, dense FP16/BF16 and INT8 tensor throughput, kernel-launch
 * overhead, kernel efficiency; link bandwidth, latency and P2P), each with its source, and
 * the timing model itself:
 *
 *   op time  = max(bytes moved / HBM bandwidth, FLOPs / throughput) / efficiency + launch
 *   transfer = latency + bytes / link bandwidth                     (per copy, per device)
 *   allreduce (ring, n devices, B bytes) = 2 (n - 1) transfers of B / n
 *
 * Figures are the vendors' datasheet peaks (dense, no sparsity); the efficiency is the
 * one stated assumption that turns a peak into an achieved rate (docs/projection.md).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "backends/sim/sim-impl.h"

#define GIB(x) ((size_t)(x) << 30)

/* Throughput: GeForce parts run FP16 tensor math with FP32 accumulation at half rate; the
 * figure below is that FP32-accumulate rate (what cuBLAS/ggml use for prompt matmuls). */
static const loom_sim_profile loom__sim_profiles[] = {
    {"h200", GIB(141), 4800, 989, 1979, 4.0, 0.75,
     "NVIDIA H200 SXM datasheet (141 GB HBM3e, 4.8 TB/s, FP16 989 / INT8 1979 dense)"},
    {"h100-sxm", GIB(80), 3350, 989, 1979, 4.0, 0.75,
     "NVIDIA H100 SXM5 datasheet (80 GB HBM3, 3.35 TB/s, FP16 989 / INT8 1979 dense)"},
    {"h100-pcie", GIB(80), 2000, 756, 1513, 4.0, 0.75,
     "NVIDIA H100 PCIe datasheet (80 GB HBM2e, 2.0 TB/s, FP16 756 / INT8 1513 dense)"},
    {"a100-80g", GIB(80), 2039, 312, 624, 4.0, 0.75,
     "NVIDIA A100 80GB SXM datasheet (2.039 TB/s, FP16 312 / INT8 624 dense)"},
    {"l40s", GIB(48), 864, 362, 733, 4.0, 0.75,
     "NVIDIA L40S datasheet (48 GB GDDR6, 864 GB/s, FP16 362 / INT8 733 dense)"},
    {"rtx-5090", GIB(32), 1792, 209.5, 838, 4.0, 0.75,
     "NVIDIA RTX Blackwell GPU architecture whitepaper, GeForce RTX 5090 (32 GB GDDR7, "
     "1792 GB/s, FP16 w/ FP32 acc 209.5 / INT8 838 dense)"},
    {"rtx-4090", GIB(24), 1008, 165.2, 660.6, 4.0, 0.75,
     "NVIDIA Ada GPU architecture whitepaper, GeForce RTX 4090 (24 GB GDDR6X, 1008 GB/s, "
     "FP16 w/ FP32 acc 165.2 / INT8 660.6 dense)"},
    {"rtx-3090", GIB(24), 936, 71, 284, 4.0, 0.75,
     "NVIDIA Ampere GA102 GPU architecture whitepaper, GeForce RTX 3090 (24 GB GDDR6X, "
     "936 GB/s, FP16 w/ FP32 acc 71 / INT8 284 dense)"},
    /* the host CPU of `loom plan`'s hybrid candidate (layers kept in host memory, -ngl):
     * a desktop of the class people pair with 2-4 consumer GPUs. Throughput: 16 cores x
     * 4.5 GHz x 32 FP32 FLOP/cycle (two 256-bit FMA pipes) = 2.3 TFLOP/s; INT8 (VNNI
     * VPDPBUSD, two 256-bit pipes, 128 ops/cycle) = 9.2 TOP/s; "launch" is the per-op
     * thread barrier of a CPU graph (~1 us) */
    {"host", GIB(128), 83.2, 2.3, 9.2, 1.0, 0.75,
     "AMD Ryzen 9 7950X product page (16 cores, 4.5 GHz base, AVX-512 on 256-bit units) "
     "with 2 channels of DDR5-5200 (JEDEC JESD79-5: 2 x 8 B x 5200 MT/s = 83.2 GB/s), "
     "4 x 32 GB DIMMs (128 GiB, an assumption)"},
};
/* Common to every profile: launch 4 us (CUDA kernel launch + dependency gap without CUDA
 * graphs, as measured by NVIDIA's Nsight for back-to-back small kernels: 2-5 us);
 * efficiency 0.75 (fraction of peak bandwidth a streaming quantised mat-vec achieves, the
 * ~75-85% of STREAM-like kernels on HBM/GDDR). */

/* Link bandwidth is per direction, as a single transfer sees it; latency is per transfer
 * (driver + DMA setup, what a small cudaMemcpyPeerAsync costs). */
static const loom_sim_link_preset_info loom__sim_links[] = {
    {"nvlink", 150.0, 2.0, true,
     "NVLink 4 bridge pair (loom's historical default: 150 GB/s per direction, 2 us)"},
    {"nvlink3", 300.0, 2.0, true, "NVLink 3 (A100): 12 links x 25 GB/s = 300 GB/s per direction"},
    {"nvlink4", 450.0, 2.0, true, "NVLink 4 (H100): 18 links x 25 GB/s = 450 GB/s per direction"},
    {"nvlink5", 900.0, 2.0, true, "NVLink 5 (B200): 18 links x 50 GB/s = 900 GB/s per direction"},
    {"nvswitch", 450.0, 3.0, true,
     "HGX H100 NVSwitch: 450 GB/s per direction any-to-any, one extra switch hop"},
    {"pcie4", 25.0, 8.0, true,
     "PCIe 4.0 x16 with P2P: 32 GB/s raw, ~25 GB/s achieved by cudaMemcpyPeer"},
    {"pcie4-nop2p", 25.0, 8.0, false,
     "PCIe 4.0 x16 without P2P (consumer boards): every device copy staged through host"},
    {"pcie5", 50.0, 6.0, true, "PCIe 5.0 x16 with P2P: 64 GB/s raw, ~50 GB/s achieved"},
    {"pcie5-nop2p", 50.0, 6.0, false, "PCIe 5.0 x16 without P2P: staged through host"},
    {"host-staged", 12.0, 10.0, false,
     "PCIe 3.0 x16 through host memory: ~12 GB/s pageable copies, no P2P"},
    {"none", 0.0, 0.0, true, "no link cost (infinitely fast)"},
};

#define LOOM__COUNT(a) (sizeof(a) / sizeof((a)[0]))

int loom_sim_profile_count(void) {
    return (int)LOOM__COUNT(loom__sim_profiles);
}

const loom_sim_profile *loom_sim_profile_get(int i) {
    return i >= 0 && i < loom_sim_profile_count() ? &loom__sim_profiles[i] : NULL;
}

/* "h200, h100-sxm, ..." */
static void loom__sim_join(char *buf, size_t size, bool links) {
    size_t n = 0;
    buf[0] = '\0';
    size_t count = links ? LOOM__COUNT(loom__sim_links) : LOOM__COUNT(loom__sim_profiles);
    for (size_t i = 0; i < count && n < size; i++) {
        const char *name = links ? loom__sim_links[i].name : loom__sim_profiles[i].name;
        n += (size_t)snprintf(buf + n, size - n, "%s%s", i ? ", " : "", name);
    }
}

loom_status loom_sim_profile_find(const char *name, const loom_sim_profile **out) {
    for (int i = 0; name && i < loom_sim_profile_count(); i++) {
        if (strcasecmp(name, loom__sim_profiles[i].name) == 0) {
            if (out) *out = &loom__sim_profiles[i];
            return LOOM_OK;
        }
    }
    char known[512];
    loom__sim_join(known, sizeof known, false);
    return loom_error(LOOM_ERR_NOT_FOUND, "unknown device profile '%s' (known: %s)",
                      name ? name : "(null)", known);
}

int loom_sim_link_preset_count(void) {
    return (int)LOOM__COUNT(loom__sim_links);
}

const loom_sim_link_preset_info *loom_sim_link_preset_get(int i) {
    return i >= 0 && i < loom_sim_link_preset_count() ? &loom__sim_links[i] : NULL;
}

loom_status loom_sim_link_preset_find(const char *name, const loom_sim_link_preset_info **out) {
    for (int i = 0; name && i < loom_sim_link_preset_count(); i++) {
        if (strcasecmp(name, loom__sim_links[i].name) == 0) {
            if (out) *out = &loom__sim_links[i];
            return LOOM_OK;
        }
    }
    char known[512];
    loom__sim_join(known, sizeof known, true);
    return loom_error(LOOM_ERR_NOT_FOUND, "unknown link preset '%s' (known: %s)",
                      name ? name : "(null)", known);
}

/* ---------------------------------------------------------------- the timing model */

static double loom__sim_bytes(const loom_tensor *t) {
    return t ? (double)loom_nbytes(t) : 0.0;
}

double loom_sim_op_flops(const loom_tensor *op) {
    const loom_tensor *a = op->src[0], *b = op->src[1];
    switch (op->op) {
    case LOOM_OP_MUL_MAT:
        /* a [K, M, ..] x b [K, N, B2, B3]: 2 K M N B2 B3 */
        return 2.0 * (double)a->ne[0] * (double)loom_nelements(op);
    case LOOM_OP_MUL_MAT_ID:
        /* only the selected experts' rows: dst [M, U, T] */
        return 2.0 * (double)a->ne[0] * (double)loom_nelements(op);
    case LOOM_OP_FLASH_ATTN_EXT: {
        /* q [D, T, H], k [D, K, Hk]: QK^T and PV, 2 D K per pair each */
        const loom_tensor *k = b;
        double D = (double)a->ne[0], T = (double)a->ne[1], H = (double)a->ne[2];
        return 4.0 * D * T * H * (double)(k ? k->ne[1] : 0);
    }
    default:
        return 5.0 * (double)loom_nelements(op); /* elementwise: a few FLOPs per element */
    }
}

double loom_sim_op_bytes(const loom_tensor *op) {
    switch (op->op) {
    case LOOM_OP_GET_ROWS:
        return 2.0 * loom__sim_bytes(op) + loom__sim_bytes(op->src[1]); /* rows read + written */
    case LOOM_OP_SET_ROWS:
        return 2.0 * loom__sim_bytes(op->src[1]); /* the rows written */
    case LOOM_OP_CPY:
        return loom__sim_bytes(op->src[0]) + loom__sim_bytes(op->src[1]);
    case LOOM_OP_MUL_MAT_ID: {
        /* the experts used: at most n_used * tokens of the E experts */
        const loom_tensor *w = op->src[0], *ids = op->src[2];
        double used = ids ? (double)loom_nelements(ids) : (double)w->ne[2];
        double frac = used < (double)w->ne[2] ? used / (double)w->ne[2] : 1.0;
        return frac * loom__sim_bytes(w) + loom__sim_bytes(op->src[1]) + loom__sim_bytes(op);
    }
    default: {
        double bytes = loom__sim_bytes(op);
        for (int j = 0; j < LOOM_MAX_SRC; j++)
            bytes += loom__sim_bytes(op->src[j]);
        return bytes;
    }
    }
}

double loom_sim_op_time_us(const loom_sim_profile *p, const loom_tensor *op) {
    if (!p || !op || op->op == LOOM_OP_NONE || loom_op_is_view(op->op)) return 0.0;
    double bytes = loom_sim_op_bytes(op), flops = loom_sim_op_flops(op);
    /* quantised weights run on the INT8 units (llama.cpp's MMQ); float ones on FP16 */
    bool matmul = op->op == LOOM_OP_MUL_MAT || op->op == LOOM_OP_MUL_MAT_ID;
    double tput = matmul && loom_blck_size(op->src[0]->type) > 1 ? p->int8_tops : p->fp16_tflops;
    double t_mem = p->hbm_gbps > 0 ? bytes / (p->hbm_gbps * 1e9) : 0.0;
    double t_flop = tput > 0 ? flops / (tput * 1e12) : 0.0;
    double eff = p->efficiency > 0 && p->efficiency <= 1 ? p->efficiency : 1.0;
    return (t_mem > t_flop ? t_mem : t_flop) / eff * 1e6 + p->launch_us;
}

double loom_sim_allreduce_time_us(const loom_sim_link *link, bool p2p, int n_devices,
                                  uint64_t bytes) {
    if (!link || n_devices < 2) return 0.0;
    /* without P2P every step is two transfers: device -> host -> device */
    double steps = 2.0 * (n_devices - 1) * (p2p ? 1 : 2);
    return steps * loom_sim_link_time_us(link, (uint64_t)ceil((double)bytes / n_devices));
}
