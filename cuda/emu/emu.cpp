/*
 * emu.cpp — the scheduler behind emu.h: blocks one after another, the threads of a block as
 * cooperative fibers (a stack each, switched by switch_to below), barriers and shuffles
 * resolved when every thread they wait for has arrived, and a launch error instead of a hang
 * when that can never happen.
 */
#include "emu.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

/* the bounds of the __shared__ section (emu.h), provided by the linker */
extern "C" char __start_pytfm_emu_shared[], __stop_pytfm_emu_shared[];
static __attribute__((section("pytfm_emu_shared"), used)) char pytfm_emu_shared_anchor[16];

namespace pytfm_emu {

/* ---- the fibers' context switch ----------------------------------------------------------
 * A fiber runs until it yields to the scheduler; the scheduler resumes one fiber at a time.
 * On x86-64 the switch is pytfm_emu_switch: it pushes the registers the SysV ABI makes a
 * callee preserve (rbx, rbp, r12-r15) and the SSE and x87 control words on the running stack,
 * stores the stack pointer, loads the other one and pops the same. glibc's swapcontext does
 * that too but also saves and restores the signal mask with a system call at every switch,
 * which nothing here needs (no fiber changes the mask) and which, at 64 switches a warp
 * collective (each lane to the scheduler and back), would dominate an emulated tensor-core
 * kernel's time. Elsewhere, or where the process runs with a shadow stack (CET: a bare stack
 * swap would return where the shadow stack does not expect), ucontext. */
#if defined(__x86_64__) && defined(__linux__)
#define PYTFM_EMU_STACK_SWITCH 1
extern "C" void pytfm_emu_switch(void **save_sp, void *load_sp);
__asm__(".text\n"
        ".p2align 4\n"
        ".type pytfm_emu_switch, @function\n"
        "pytfm_emu_switch:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  subq $8, %rsp\n"
        "  stmxcsr (%rsp)\n"
        "  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n"
        "  fldcw 4(%rsp)\n"
        "  addq $8, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size pytfm_emu_switch, .-pytfm_emu_switch\n");

/* whether this process runs with a user shadow stack (Linux's ARCH_SHSTK_STATUS, 0x5005; a
 * kernel without it answers EINVAL: none) */
static bool shadow_stack_on() {
    unsigned long features = 0;
    return syscall(SYS_arch_prctl, 0x5005, &features) == 0 && (features & 1);
}
#else
#define PYTFM_EMU_STACK_SWITCH 0
#endif

struct Context {
    void *sp;       // the saved stack pointer (the stack switch)
    ucontext_t *uc; // the saved context (ucontext; held apart: a ucontext_t is near 1 KiB,
                    // which would spread the fibers a warp operation reads over many lines)
};

// the switch asked for (pytfm_emu_set_switch): 0 the stack switch where there is one, 1
// ucontext; -1: not yet read from the environment (PYTFM_EMU_SWITCH=ucontext)
static int switch_request = -1;
// the switch of the launch running now, fixed when it starts (launches run one at a time)
static bool stack_switch_now;

/* the switch the next launch uses: true for the stack switch */
static bool choose_switch() {
    if (switch_request < 0) {
        const char *mode = getenv("PYTFM_EMU_SWITCH");
        switch_request = mode && !strcmp(mode, "ucontext");
    }
#if PYTFM_EMU_STACK_SWITCH
    static const bool shadow_stack = shadow_stack_on();
    return switch_request == 0 && !shadow_stack;
#else
    return false;
#endif
}

/* leave `from` (saving where it stands) and resume `to` */
static inline void switch_to(Context &from, Context &to) {
#if PYTFM_EMU_STACK_SWITCH
    if (stack_switch_now) {
        pytfm_emu_switch(&from.sp, to.sp);
        return;
    }
#endif
    swapcontext(from.uc, to.uc);
}

/* make c start entry() on the stack [stack, stack + size) when first switched to; entry
 * must never return (it switches away for good at its end) */
static void start_context(Context &c, char *stack, size_t size, void (*entry)()) {
#if PYTFM_EMU_STACK_SWITCH
    if (stack_switch_now) {
        // what pytfm_emu_switch pops, from the low address: the control words (the running
        // thread's), r15, r14, r13, r12, rbx, rbp, then the address it returns to (entry), and
        // a zero where entry's caller would have left its return address: so entry starts with
        // the stack pointer 8 past a 16-byte boundary, as after a call
        uint64_t *top = (uint64_t *)(((uintptr_t)(stack + size)) & ~(uintptr_t)15);
        uint64_t *sp = top - 9;
        uint32_t mxcsr;
        uint16_t fpucw;
        __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
        __asm__ volatile("fnstcw %0" : "=m"(fpucw));
        sp[0] = (uint64_t)mxcsr | (uint64_t)fpucw << 32;
        for (int i = 1; i <= 6; i++) sp[i] = 0;
        sp[7] = (uint64_t)(uintptr_t)entry;
        sp[8] = 0;
        c.sp = sp;
        return;
    }
#endif
    getcontext(c.uc);
    c.uc->uc_stack.ss_sp = stack;
    c.uc->uc_stack.ss_size = size;
    c.uc->uc_link = nullptr;
    makecontext(c.uc, entry, 0);
}

enum State { RUNNABLE, AT_SYNCTHREADS, AT_WARP, EXITED };

static const char *const op_names[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                       "__shfl_xor_sync",
                                       "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
                                       "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
                                       "ldmatrix.sync.aligned.m8n8.x1.shared.b16",
                                       "ldmatrix.sync.aligned.m8n8.x2.shared.b16",
                                       "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
                                       "ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16",
                                       "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
                                       "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"};

static bool is_ldmatrix(WarpOp op) { return op >= LDMATRIX_X1 && op <= LDMATRIX_X4_TRANS; }
static int ldmatrix_num(WarpOp op) { return 1 << ((op - LDMATRIX_X1) % 3); }

/* a queued cp.async: group -1 until the thread's next commit */
struct AsyncCopy {
    void *dst;
    const void *src;
    int size, src_bytes;
    long group;
};

struct Fiber {
    Context ctx;
    State state;
    dim3 tid;
    WarpOp op;
    unsigned mask;
    uint64_t value, result;
    int arg, width;
    uint32_t fa[4], fb[2]; // an mma's A and B fragments (registers as the lane holds them)
    float fc[4], fd[4];    // its C fragment, and D handed back
    uint32_t lm[4];        // an ldmatrix's registers handed back
    std::vector<AsyncCopy> copies; // issued, not yet performed (cp_async)
    long groups;                   // groups committed so far
};

struct Launch {
    dim3 grid, block, bidx;
    const std::function<void()> *body;
    std::vector<Fiber> fibers;
    std::vector<unsigned char> shmem;
    Context scheduler;
    std::vector<ucontext_t> ucontexts; // the fibers' and the scheduler's, under ucontext
    Fiber *current;
    std::string error; // the first failure; the launch stops there
};

static thread_local Launch *active;
// the order the fibers of a block run in (pytfm_emu_set_order): 0 first to last, 1 last to
// first, 2 warp by warp, each warp to its next barrier (run_ahead)
static int reverse_order;
// cp.async lands at its issue (1) or at the wait (0); -1: not yet read from the environment
static int cp_async_eager = -1;
static thread_local cudaError_t last_error = cudaSuccess;
static thread_local std::string last_message;

/* ldmatrix's shared memory traffic (pytfm_emu_ldmatrix_counts): instructions (per warp),
 * matrices, and wavefronts: each matrix's 8 rows of 16 bytes are one 128-byte wavefront when
 * they fall in 32 distinct banks; a bank that n distinct 4-byte words of them share costs n. */
static std::mutex ldmatrix_lock;
static int64_t ldmatrix_counts[3];

/* per kernel (its address), the dynamic shared memory limit raised by cudaFuncSetAttribute */
static std::mutex limits_lock;
static std::map<const void *, int> shared_limits;

/* pytfm_emu_counters, and the graphs: a capture's launches, to run again */
static std::mutex counters_lock;
static int64_t counters[PYTFM_EMU_COUNTERS];

static void count(int what) {
    std::lock_guard<std::mutex> lock(counters_lock);
    counters[what]++;
}

struct Recorded {
    dim3 grid, block;
    size_t shmem;
    std::function<void()> body; // the kernel and its arguments, as captured
};
static std::mutex graphs_lock;
static std::vector<Recorded> *capturing; // the open capture, or NULL
static std::vector<std::vector<Recorded> *> graphs;

static bool in_capture() {
    std::lock_guard<std::mutex> lock(graphs_lock);
    return capturing != nullptr;
}

/* the error a runtime call that is not allowed during a capture returns (to its caller: the
 * next launch's cudaGetLastError does not see it) */
static cudaError_t refuse_in_capture(const char *call) {
    last_message = std::string("emulator: ") + call + " during a graph capture: a captured step "
                   "must not allocate, copy or synchronise";
    return cudaErrorStreamCaptureUnsupported;
}

static void fail(Launch &l, const char *fmt, ...) {
    if (!l.error.empty()) return;
    char buf[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(buf, sizeof buf, fmt, args);
    va_end(args);
    char where[96];
    snprintf(where, sizeof where, "emulator: block (%u,%u,%u): ", l.bidx.x, l.bidx.y, l.bidx.z);
    l.error = std::string(where) + buf;
}

static std::string thread_name(const Fiber &f) {
    char buf[48];
    snprintf(buf, sizeof buf, "(%u,%u,%u)", f.tid.x, f.tid.y, f.tid.z);
    return buf;
}

void fail_launch(const char *fmt, ...) {
    char buf[400];
    va_list args;
    va_start(args, fmt);
    vsnprintf(buf, sizeof buf, fmt, args);
    va_end(args);
    if (!active || !active->current) { // not inside a kernel: a host-side misuse
        last_error = cudaErrorLaunchFailure;
        last_message = std::string("emulator: ") + buf;
        return;
    }
    fail(*active, "thread %s: %s", thread_name(*active->current).c_str(), buf);
}

const dim3 &thread_idx() { return active->current->tid; }
const dim3 &block_idx() { return active->bidx; }
const dim3 &block_dim() { return active->block; }
const dim3 &grid_dim() { return active->grid; }
void *dynamic_shared() { return active->shmem.data(); }

/* cp.async, at its latest: queued per thread, performed by the wait that covers its group */
static bool in_shared(const Launch &l, const void *p, int size) {
    const char *c = (const char *)p;
    const char *d = (const char *)l.shmem.data();
    return (c >= __start_pytfm_emu_shared && c + size <= __stop_pytfm_emu_shared) ||
           (c >= d && c + size <= d + l.shmem.size());
}

void cp_async(void *dst, const void *src, int size, int src_bytes) {
    if (!active || !active->current) {
        fail_launch("cp.async outside a kernel");
        return;
    }
    if (size != 16 && size != 4) {
        fail_launch("cp.async of %d bytes (4 or 16 here)", size);
        return;
    }
    if (src_bytes < 0 || src_bytes > size) {
        fail_launch("cp.async of %d bytes reading %d of them", size, src_bytes);
        return;
    }
    if (((uintptr_t)dst | (uintptr_t)src) % size) {
        fail_launch("cp.async of %d bytes from %p to %p, which are not both %d-byte aligned",
                    size, src, dst, size);
        return;
    }
    if (!in_shared(*active, dst, size)) {
        fail_launch("cp.async to %p, which is not in shared memory", dst);
        return;
    }
    if (cp_async_eager < 0) {
        const char *mode = getenv("PYTFM_EMU_CP_ASYNC");
        cp_async_eager = mode && !strcmp(mode, "eager");
    }
    if (cp_async_eager) { // at its earliest: the copy lands now
        memcpy(dst, src, (size_t)src_bytes);
        memset((char *)dst + src_bytes, 0, (size_t)(size - src_bytes));
        return;
    }
    active->current->copies.push_back({dst, src, size, src_bytes, -1});
}

void cp_async_commit() {
    if (!active || !active->current) return fail_launch("cp.async.commit_group outside a kernel");
    Fiber *f = active->current;
    for (AsyncCopy &c : f->copies)
        if (c.group < 0) c.group = f->groups;
    f->groups++; // an empty group counts too, as on the GPU
}

void cp_async_wait(int pending) {
    if (!active || !active->current) return fail_launch("cp.async.wait_group outside a kernel");
    Fiber *f = active->current;
    const long done = f->groups - pending; // groups [0, done) must be complete
    size_t kept = 0;
    for (size_t i = 0; i < f->copies.size(); i++) {
        const AsyncCopy &c = f->copies[i];
        if (c.group >= 0 && c.group < done) {
            memcpy(c.dst, c.src, (size_t)c.src_bytes);
            memset((char *)c.dst + c.src_bytes, 0, (size_t)(c.size - c.src_bytes));
        } else {
            f->copies[kept++] = c;
        }
    }
    f->copies.resize(kept);
}

static void yield(State state) {
    Fiber *f = active->current;
    f->state = state;
    switch_to(f->ctx, active->scheduler);
}

void syncthreads() { yield(AT_SYNCTHREADS); }

uint64_t warp_op(WarpOp op, unsigned mask, uint64_t value, int arg, int width) {
    Fiber *f = active->current;
    f->op = op;
    f->mask = mask;
    f->value = value;
    f->arg = arg;
    f->width = width;
    yield(AT_WARP);
    return f->result;
}

MmaSlot mma_layout(WarpOp op, char which, int row, int col) {
    if (which == 'c') return {row % 8 * 4 + col / 2, row / 8 * 2 + col % 2, 0};
    if (op == MMA_TF32_M16N8K8) {
        if (which == 'a') return {row % 8 * 4 + col % 4, row / 8 + 2 * (col / 4), 0};
        return {col * 4 + row % 4, row / 4, 0}; // b: row is k, col is n
    }
    if (which == 'a') return {row % 8 * 4 + col % 8 / 2, row / 8 + 2 * (col / 8), col % 2};
    return {col * 4 + row % 8 / 2, row / 8, row % 2};
}

void mma(WarpOp op, float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    if (!active || !active->current) return fail_launch("%s outside a kernel", op_names[op]);
    Fiber *f = active->current;
    memcpy(f->fa, a, sizeof f->fa);
    memcpy(f->fb, b, sizeof f->fb);
    memcpy(f->fc, c, sizeof f->fc);
    f->op = op;
    f->mask = 0xffffffffu; // .aligned: the whole warp
    f->arg = 0;
    f->width = 32;
    yield(AT_WARP);
    memcpy(d, f->fd, sizeof f->fd);
}

MmaSlot ldmatrix_slot(bool trans, int row, int col) {
    if (trans) return {col * 4 + row / 2, 0, row % 2};
    return {row * 4 + col / 2, 0, col % 2};
}

void ldmatrix(uint32_t *r, int num, bool trans, const void *row) {
    const WarpOp op = (WarpOp)(LDMATRIX_X1 + (num == 4 ? 2 : num - 1) + (trans ? 3 : 0));
    if (!active || !active->current) return fail_launch("%s outside a kernel", op_names[op]);
    if (num != 1 && num != 2 && num != 4) return fail_launch("ldmatrix of %d matrices", num);
    Fiber *f = active->current;
    f->op = op;
    f->mask = 0xffffffffu; // .aligned: the whole warp
    f->value = (uint64_t)(uintptr_t)row;
    f->arg = 0;
    f->width = 32;
    yield(AT_WARP);
    memcpy(r, f->lm, sizeof(uint32_t) * (size_t)num);
}

/* The wavefronts of one matrix's 8 row addresses (see ldmatrix_counts): the most distinct
 * 32-bit words that fall in one bank. Rows are 16-byte aligned, so two rows are the same
 * words or share none: the distinct rows' 4 words each are the distinct words. */
static int64_t ldmatrix_wavefronts(const Fiber *rows) {
    int per_bank[32] = {0};
    for (int i = 0; i < 8; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= rows[j].value == rows[i].value;
        if (seen) continue;
        for (int w = 0; w < 4; w++) per_bank[((uintptr_t)rows[i].value / 4 + (uintptr_t)w) % 32]++;
    }
    int64_t worst = 1;
    for (int bank = 0; bank < 32; bank++)
        if (per_bank[bank] > worst) worst = per_bank[bank];
    return worst;
}

/* Complete an ldmatrix over the 32 lanes of a warp (all of them there): false (recorded) on
 * an address that is not 16 aligned bytes of shared memory */
static bool complete_ldmatrix(Launch &l, Fiber *lanes, WarpOp op) {
    const int num = ldmatrix_num(op);
    const bool trans = op >= LDMATRIX_X1_TRANS;
    for (int i = 0; i < 8 * num; i++) {
        const void *p = (const void *)(uintptr_t)lanes[i].value;
        if ((uintptr_t)p % 16 || !in_shared(l, p, 16)) {
            fail(l, "thread %s gives %s the row address %p, which is not 16 bytes of shared "
                    "memory on a 16-byte boundary",
                 thread_name(lanes[i]).c_str(), op_names[op], p);
            return false;
        }
    }
    int64_t waves = 0;
    for (int q = 0; q < num; q++) {
        waves += ldmatrix_wavefronts(lanes + 8 * q);
        for (int row = 0; row < 8; row++) {
            uint16_t e[8];
            memcpy(e, (const void *)(uintptr_t)lanes[8 * q + row].value, sizeof e);
            for (int col = 0; col < 8; col++) {
                const MmaSlot s = ldmatrix_slot(trans, row, col);
                uint32_t &reg = lanes[s.lane].lm[q];
                reg = (reg & (s.half ? 0x0000ffffu : 0xffff0000u)) |
                      (uint32_t)e[col] << (16 * s.half);
            }
        }
    }
    std::lock_guard<std::mutex> lock(ldmatrix_lock);
    ldmatrix_counts[0]++;
    ldmatrix_counts[1] += num;
    ldmatrix_counts[2] += waves;
    return true;
}

/* An operand element as the tensor core reads it: a TF32 register's top 19 bits (the low 13
 * ignored), or one 16-bit half of a BF16 pair */
static float mma_operand(WarpOp op, uint32_t reg, int half) {
    const uint32_t bits = op == MMA_TF32_M16N8K8 ? reg & 0xffffe000u : (reg >> (16 * half)) << 16;
    float v;
    memcpy(&v, &bits, 4);
    return v;
}

/* mma_layout for every element of one instruction's fragments, tabulated once per op: the
 * layout stays mma_layout's (the self-test checks it against the PTX ISA), the products look
 * it up */
struct MmaTable {
    MmaSlot a[16][16], b[16][8], c[16][8];
};

static MmaTable mma_table(WarpOp op) {
    MmaTable t;
    const int K = op == MMA_TF32_M16N8K8 ? 8 : 16;
    for (int r = 0; r < 16; r++)
        for (int p = 0; p < K; p++) t.a[r][p] = mma_layout(op, 'a', r, p);
    for (int p = 0; p < K; p++)
        for (int j = 0; j < 8; j++) t.b[p][j] = mma_layout(op, 'b', p, j);
    for (int r = 0; r < 16; r++)
        for (int j = 0; j < 8; j++) t.c[r][j] = mma_layout(op, 'c', r, j);
    return t;
}

/* D = A·B + C over the 32 lanes of a warp (all of them there), fragments per mma_layout;
 * each D element C + Σ_p A[r][p]·B[p][j], p in order, each step one fmaf (rounded once). The
 * 128 elements are independent chains, stepped together (p outermost) so that the compiler
 * may run them as vectors, many at once (tests/cuda_emu.py builds with -mfma where the CPU
 * has FMA) */
static void complete_mma(Fiber *lanes, WarpOp op) {
    static const MmaTable tables[2] = {mma_table(MMA_TF32_M16N8K8),
                                       mma_table(MMA_BF16_M16N8K16)};
    const MmaTable &t = tables[op == MMA_BF16_M16N8K16];
    const int K = op == MMA_TF32_M16N8K8 ? 8 : 16;
    float A[16][16], B[16][8];
    for (int r = 0; r < 16; r++)
        for (int p = 0; p < K; p++) {
            const MmaSlot s = t.a[r][p];
            A[r][p] = mma_operand(op, lanes[s.lane].fa[s.reg], s.half);
        }
    for (int p = 0; p < K; p++)
        for (int j = 0; j < 8; j++) {
            const MmaSlot s = t.b[p][j];
            B[p][j] = mma_operand(op, lanes[s.lane].fb[s.reg], s.half);
        }
    float acc[16][8];
    for (int r = 0; r < 16; r++)
        for (int j = 0; j < 8; j++) {
            const MmaSlot s = t.c[r][j];
            acc[r][j] = lanes[s.lane].fc[s.reg];
        }
    for (int p = 0; p < K; p++)
        for (int r = 0; r < 16; r++)
            for (int j = 0; j < 8; j++) acc[r][j] = fmaf(A[r][p], B[p][j], acc[r][j]);
    for (int r = 0; r < 16; r++)
        for (int j = 0; j < 8; j++) {
            const MmaSlot s = t.c[r][j];
            lanes[s.lane].fd[s.reg] = acc[r][j];
        }
}

/* a fiber's life: the kernel's body, then back to the scheduler for good */
static void fiber_main() {
    (*active->body)();
    Fiber *f = active->current;
    f->state = EXITED;
    switch_to(f->ctx, active->scheduler);
}

/* The lane a shuffle reads, as the CUDA programming guide defines it for each variant. */
static int source_lane(const Fiber &f, int lane) {
    const int w = f.width, base = lane & ~(w - 1);
    switch (f.op) {
    case SHFL_IDX: return base + (f.arg & (w - 1));
    case SHFL_UP: return lane - f.arg >= base ? lane - f.arg : lane;
    case SHFL_DOWN: return lane + f.arg < base + w ? lane + f.arg : lane;
    case SHFL_XOR: return (lane ^ f.arg) < base + w ? lane ^ f.arg : lane;
    default: break; // no shuffle: complete_warp_op computes the product or the load
    }
    return lane; // not reached: every WarpOp is a shuffle named above
}

/* Complete the warp operation that lane `first` of `warp` waits at, if all its lanes are
 * there. Returns 1 when it completed, 0 when it must wait, -1 on an error (recorded). */
static int complete_warp_op(Launch &l, size_t warp, size_t first) {
    const size_t n = l.fibers.size();
    Fiber &a = l.fibers[first];
    const int lane0 = (int)(first - warp * 32);
    if (!(a.mask >> lane0 & 1u)) {
        fail(l, "thread %s calls %s with mask 0x%08x, which leaves out its own lane %d",
             thread_name(a).c_str(), op_names[a.op], a.mask, lane0);
        return -1;
    }
    if (a.width < 1 || a.width > 32 || (a.width & (a.width - 1))) {
        fail(l, "thread %s calls %s with width %d (a power of two <= 32 is required)",
             thread_name(a).c_str(), op_names[a.op], a.width);
        return -1;
    }
    for (int lane = 0; lane < 32; lane++) {
        if (!(a.mask >> lane & 1u)) continue;
        const size_t i = warp * 32 + lane;
        if (i >= n) {
            fail(l, "thread %s calls %s with mask 0x%08x, naming lane %d that does not exist "
                    "(the block has %zu threads)",
                 thread_name(a).c_str(), op_names[a.op], a.mask, lane, n);
            return -1;
        }
        const Fiber &b = l.fibers[i];
        if (b.state == EXITED) {
            fail(l, "thread %s exited while thread %s waits for it at %s (mask 0x%08x)",
                 thread_name(b).c_str(), thread_name(a).c_str(), op_names[a.op], a.mask);
            return -1;
        }
        if (b.state != AT_WARP) return 0;
        if (b.op != a.op || b.mask != a.mask) {
            fail(l, "threads %s and %s of one warp wait at different warp operations (%s, mask "
                    "0x%08x and %s, mask 0x%08x)",
                 thread_name(a).c_str(), thread_name(b).c_str(), op_names[a.op], a.mask,
                 op_names[b.op], b.mask);
            return -1;
        }
    }
    if (a.op == MMA_TF32_M16N8K8 || a.op == MMA_BF16_M16N8K16) {
        complete_mma(&l.fibers[warp * 32], a.op);
        for (int lane = 0; lane < 32; lane++) l.fibers[warp * 32 + lane].state = RUNNABLE;
        return 1;
    }
    if (is_ldmatrix(a.op)) {
        if (!complete_ldmatrix(l, &l.fibers[warp * 32], a.op)) return -1;
        for (int lane = 0; lane < 32; lane++) l.fibers[warp * 32 + lane].state = RUNNABLE;
        return 1;
    }
    for (int lane = 0; lane < 32; lane++) {
        if (!(a.mask >> lane & 1u)) continue;
        Fiber &b = l.fibers[warp * 32 + lane];
        const int src = source_lane(b, lane);
        if (!(a.mask >> src & 1u)) {
            fail(l, "thread %s reads lane %d in %s, which is not in the mask 0x%08x",
                 thread_name(b).c_str(), src, op_names[a.op], a.mask);
            return -1;
        }
        b.result = l.fibers[warp * 32 + src].value;
    }
    for (int lane = 0; lane < 32; lane++)
        if (a.mask >> lane & 1u) l.fibers[warp * 32 + lane].state = RUNNABLE;
    return 1;
}

/* Nothing can run: release what can be released, or explain why nothing ever will. */
static bool resolve(Launch &l) {
    const size_t n = l.fibers.size();
    bool progress = false;
    for (size_t warp = 0; warp * 32 < n; warp++)
        for (size_t i = warp * 32; i < n && i < warp * 32 + 32; i++)
            if (l.fibers[i].state == AT_WARP) {
                const int r = complete_warp_op(l, warp, i);
                if (r < 0) return false;
                progress |= r > 0;
                break; // one operation per warp per round
            }
    if (progress) return true;
    size_t at_sync = 0, exited = 0;
    const Fiber *gone = nullptr, *waiting = nullptr, *in_warp = nullptr;
    for (const Fiber &f : l.fibers) {
        if (f.state == AT_SYNCTHREADS) {
            at_sync++;
            if (!waiting) waiting = &f;
        }
        if (f.state == EXITED) {
            exited++;
            if (!gone) gone = &f;
        }
        if (f.state == AT_WARP && !in_warp) in_warp = &f;
    }
    if (at_sync == n) {
        for (Fiber &f : l.fibers) f.state = RUNNABLE;
        return true;
    }
    if (in_warp && waiting)
        fail(l, "deadlock: thread %s waits at %s while thread %s waits at __syncthreads()",
             thread_name(*in_warp).c_str(), op_names[in_warp->op], thread_name(*waiting).c_str());
    else if (gone && waiting)
        fail(l, "thread %s (and %zu more) exited while %zu threads wait at __syncthreads(), "
                "e.g. thread %s: a barrier that not every thread of the block reaches",
             thread_name(*gone).c_str(), exited - 1, at_sync, thread_name(*waiting).c_str());
    else
        fail(l, "deadlock: thread %s waits at %s for lanes that never arrive",
             in_warp ? thread_name(*in_warp).c_str() : "?", in_warp ? op_names[in_warp->op] : "?");
    return false;
}

/* Order 2: each warp in turn runs alone, its warp operations completed as soon as its own
 * lanes reach them, until it waits at a barrier or exits; then the next warp. Between two
 * barriers one warp so runs all the way ahead of the others, which the sweeps of orders 0 and
 * 1 never let happen (they advance every warp by one warp operation a round): a read of a
 * buffer that another warp has yet to fill, or a refill of one it has yet to read, with no
 * barrier between, shows. false on an error (recorded). */
static bool run_ahead(Launch &l) {
    const size_t n = l.fibers.size();
    for (size_t warp = 0; warp * 32 < n; warp++) {
        const size_t end = n < warp * 32 + 32 ? n : warp * 32 + 32;
        for (;;) {
            bool ran = false;
            for (size_t i = warp * 32; i < end; i++) {
                Fiber &f = l.fibers[i];
                if (f.state != RUNNABLE) continue;
                l.current = &f;
                switch_to(l.scheduler, f.ctx);
                ran = true;
            }
            if (!ran || !l.error.empty()) break;
            size_t i = warp * 32;
            while (i < end && l.fibers[i].state != AT_WARP) i++;
            if (i == end) break; // at a barrier or gone: the next warp
            const int r = complete_warp_op(l, warp, i);
            if (r < 0) return false;
            if (r == 0) break; // lanes elsewhere: resolve() says why
        }
        if (!l.error.empty()) return false;
    }
    return true;
}

static void run_block(Launch &l, char *stacks, size_t stack_size) {
    const size_t n = l.fibers.size();
    for (size_t i = 0; i < n; i++) {
        Fiber &f = l.fibers[i];
        f.tid = dim3((unsigned)(i % l.block.x), (unsigned)(i / l.block.x % l.block.y),
                     (unsigned)(i / ((size_t)l.block.x * l.block.y)));
        f.state = RUNNABLE;
        f.copies.clear(); // a copy never waited for is dropped with its block
        f.groups = 0;
        start_context(f.ctx, stacks + i * stack_size, stack_size, fiber_main);
    }
    memset(l.shmem.data(), 0xff, l.shmem.size());
    memset(__start_pytfm_emu_shared, 0xff, __stop_pytfm_emu_shared - __start_pytfm_emu_shared);
    size_t exited = 0;
    while (exited < n) {
        if (reverse_order == 2 && !run_ahead(l)) return;
        for (size_t k = 0; k < n && reverse_order != 2; k++) {
            Fiber &f = l.fibers[reverse_order ? n - 1 - k : k];
            if (f.state != RUNNABLE) continue;
            l.current = &f;
            switch_to(l.scheduler, f.ctx);
        }
        exited = 0;
        for (const Fiber &f : l.fibers) exited += f.state == EXITED;
        if (exited < n && !resolve(l)) return;
    }
}

static void run_launch(dim3 grid, dim3 block, size_t shmem, const std::function<void()> &body);

void launch(dim3 grid, dim3 block, size_t shmem, const std::function<void()> &body,
            const void *key) {
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    size_t shared_limit = PYTFM_EMU_DEFAULT_SHARED;
    {
        std::lock_guard<std::mutex> lock(limits_lock);
        const auto it = shared_limits.find(key);
        if (it != shared_limits.end()) shared_limit = (size_t)it->second;
    }
    if (!grid.x || !grid.y || !grid.z || !threads || threads > 1024 || block.z > 64 ||
        grid.y > 65535 || grid.z > 65535 || grid.x > 2147483647u || shmem > shared_limit) {
        last_error = cudaErrorInvalidConfiguration;
        char buf[400];
        snprintf(buf, sizeof buf,
                 "invalid configuration argument (emulator: grid (%u,%u,%u), block (%u,%u,%u), "
                 "%zu bytes of dynamic shared memory%s)",
                 grid.x, grid.y, grid.z, block.x, block.y, block.z, shmem,
                 shmem <= shared_limit ? ""
                 : shared_limit == PYTFM_EMU_DEFAULT_SHARED
                     ? "; over 48 KiB needs cudaFuncSetAttribute(kernel, "
                       "cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) first"
                     : "; more than this kernel's cudaFuncAttributeMaxDynamicSharedMemorySize");
        last_message = buf;
        return;
    }
    if (active) { // a launch from inside a kernel
        last_error = cudaErrorLaunchFailure;
        last_message = "emulator: nested launches are not supported";
        return;
    }
    {
        std::lock_guard<std::mutex> lock(graphs_lock);
        if (capturing) { // recorded, not run: as a kernel launched on a capturing stream
            capturing->push_back(Recorded{grid, block, shmem, body});
            std::lock_guard<std::mutex> count_lock(counters_lock);
            counters[PYTFM_EMU_CAPTURED]++;
            return;
        }
    }
    run_launch(grid, block, shmem, body);
}

static void run_launch(dim3 grid, dim3 block, size_t shmem, const std::function<void()> &body) {
    count(PYTFM_EMU_LAUNCHES);
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    const size_t stack_size = 64 * 1024;
    char *stacks = (char *)mmap(nullptr, threads * stack_size, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (stacks == MAP_FAILED) {
        last_error = cudaErrorLaunchFailure;
        last_message = "emulator: no memory for the fiber stacks";
        return;
    }
    static std::mutex one_at_a_time; // the __shared__ section is one for the process
    std::lock_guard<std::mutex> lock(one_at_a_time);
    stack_switch_now = choose_switch();
    Launch l;
    l.grid = grid;
    l.block = block;
    l.body = &body;
    l.fibers.resize(threads);
    if (!stack_switch_now) {
        l.ucontexts.resize(threads + 1);
        for (size_t i = 0; i < threads; i++) l.fibers[i].ctx.uc = &l.ucontexts[i];
        l.scheduler.uc = &l.ucontexts[threads];
    }
    l.shmem.resize(shmem ? shmem : 1);
    l.current = nullptr;
    active = &l;
    for (unsigned z = 0; z < grid.z && l.error.empty(); z++)
        for (unsigned y = 0; y < grid.y && l.error.empty(); y++)
            for (unsigned x = 0; x < grid.x && l.error.empty(); x++) {
                l.bidx = dim3(x, y, z);
                run_block(l, stacks, stack_size);
            }
    active = nullptr;
    munmap(stacks, threads * stack_size);
    if (!l.error.empty()) {
        last_error = cudaErrorLaunchFailure;
        last_message = l.error;
    }
}

} // namespace pytfm_emu

/* The order in which the fibers of a block run between barriers: 0 first to last, 1 last to
 * first, 2 warp by warp, each to its next barrier before the next starts (run_ahead). Code
 * that reads shared memory another thread writes, without a barrier between, reads stale data
 * in one of the first two orders; code that relies on warps keeping pace with each other (no
 * barrier between a warp's use of a buffer and another's refill of it) fails in the third.
 * The tests run each kernel in the first two, the tensor-core ones in all three. */
extern "C" __attribute__((visibility("default"))) void pytfm_emu_set_order(int reverse) {
    pytfm_emu::reverse_order = reverse;
}

/* cp.async's mode: 1 eager (each copy lands at its issue), 0 at the wait (the default, unless
 * PYTFM_EMU_CP_ASYNC=eager was in the environment at the first copy). */
extern "C" __attribute__((visibility("default"))) void pytfm_emu_set_cp_async(int eager) {
    pytfm_emu::cp_async_eager = eager != 0;
}

/* The fibers' context switch from the next launch on: 1 glibc's ucontext, 0 the stack switch
 * (emu.cpp), where the platform has one (x86-64 Linux without a shadow stack; else ucontext
 * in any case). The default is 0, unless PYTFM_EMU_SWITCH=ucontext was in the environment at
 * the first launch. Both run the fibers in the same order: every result is the same. */
extern "C" __attribute__((visibility("default"))) void pytfm_emu_set_switch(int ucontext) {
    pytfm_emu::switch_request = ucontext != 0;
}

/* The switch the next launch uses: 1 ucontext, 0 the stack switch. */
extern "C" __attribute__((visibility("default"))) int pytfm_emu_switch_kind(void) {
    return pytfm_emu::choose_switch() ? 0 : 1;
}

cudaError_t cudaGetLastError(void) {
    const cudaError_t e = pytfm_emu::last_error;
    pytfm_emu::last_error = cudaSuccess;
    return e;
}

const char *cudaGetErrorString(cudaError_t error) {
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInsufficientDriver:
        return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorInvalidConfiguration:
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorLaunchFailure: return pytfm_emu::last_message.c_str();
    }
    return "unknown error";
}

const char *cudaGetErrorName(cudaError_t error) {
    switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    }
    return "cudaErrorUnknown";
}

cudaError_t cudaGetDeviceCount(int *count) {
    *count = 1; // the emulator
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t) {
    if (pytfm_emu::in_capture()) return pytfm_emu::refuse_in_capture("cudaStreamSynchronize");
    pytfm_emu::count(PYTFM_EMU_SYNC);
    return cudaSuccess;
}

cudaError_t cudaMallocAsync(void **ptr, size_t bytes, cudaStream_t) {
    if (pytfm_emu::in_capture()) return pytfm_emu::refuse_in_capture("cudaMallocAsync");
    pytfm_emu::count(PYTFM_EMU_MALLOC_ASYNC);
    *ptr = malloc(bytes ? bytes : 1);
    return *ptr ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFreeAsync(void *ptr, cudaStream_t) {
    if (pytfm_emu::in_capture()) return pytfm_emu::refuse_in_capture("cudaFreeAsync");
    pytfm_emu::count(PYTFM_EMU_FREE_ASYNC);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t bytes) {
    if (pytfm_emu::in_capture()) return pytfm_emu::refuse_in_capture("cudaMalloc");
    pytfm_emu::count(PYTFM_EMU_MALLOC);
    *ptr = malloc(bytes ? bytes : 1);
    return *ptr ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFree(void *ptr) {
    if (pytfm_emu::in_capture()) return pytfm_emu::refuse_in_capture("cudaFree");
    pytfm_emu::count(PYTFM_EMU_FREE);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t) {
    if (pytfm_emu::in_capture()) return pytfm_emu::refuse_in_capture("cudaMemcpyAsync");
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDeviceToDevice)
        return cudaErrorInvalidValue;
    pytfm_emu::count(PYTFM_EMU_MEMCPY);
    if (bytes) memmove(dst, src, bytes);
    return cudaSuccess;
}

/* a stream: a distinct non-NULL handle (one byte of heap); its work runs at once (emu.h) */
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned) {
    *stream = (cudaStream_t)malloc(1);
    return *stream ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    pytfm_emu::count(PYTFM_EMU_SYNC); // the runtime waits for the stream's work first
    free(stream);
    return cudaSuccess;
}

/* ---- counters and graphs, for the tests ---------------------------------------------- */

#define EMU_EXPORT extern "C" __attribute__((visibility("default")))

/* out[PYTFM_EMU_COUNTERS]: the counts since the library was loaded (emu.h's enum) */
EMU_EXPORT void pytfm_emu_counters(int64_t *out) {
    std::lock_guard<std::mutex> lock(pytfm_emu::counters_lock);
    for (int i = 0; i < PYTFM_EMU_COUNTERS; i++) out[i] = pytfm_emu::counters[i];
}

/* out[3]: ldmatrix's instructions (one per warp), matrices and shared memory wavefronts since
 * the library was loaded (a bank-conflict-free load takes one wavefront per matrix) */
EMU_EXPORT void pytfm_emu_ldmatrix_counts(int64_t *out) {
    std::lock_guard<std::mutex> lock(pytfm_emu::ldmatrix_lock);
    for (int i = 0; i < 3; i++) out[i] = pytfm_emu::ldmatrix_counts[i];
}

/* Start recording launches instead of running them: 0, or -1 when a capture is open. */
EMU_EXPORT int pytfm_emu_capture_begin(void) {
    std::lock_guard<std::mutex> lock(pytfm_emu::graphs_lock);
    if (pytfm_emu::capturing) return -1;
    pytfm_emu::capturing = new std::vector<pytfm_emu::Recorded>();
    return 0;
}

/* The launches the open capture holds so far (-1: none open): where a host operation recorded
 * beside them (the stand-in CuPy's) goes in their order. */
EMU_EXPORT int64_t pytfm_emu_capture_length(void) {
    std::lock_guard<std::mutex> lock(pytfm_emu::graphs_lock);
    return pytfm_emu::capturing ? (int64_t)pytfm_emu::capturing->size() : -1;
}

/* End the capture: its graph's id (>= 0), or -1 when none was open. */
EMU_EXPORT int64_t pytfm_emu_capture_end(void) {
    std::lock_guard<std::mutex> lock(pytfm_emu::graphs_lock);
    if (!pytfm_emu::capturing) return -1;
    pytfm_emu::graphs.push_back(pytfm_emu::capturing);
    pytfm_emu::capturing = nullptr;
    return (int64_t)pytfm_emu::graphs.size() - 1;
}

/* Run launches [begin, end) of graph (end -1: to its last), in order, as recorded: 0, or the
 * first failure's error (cudaGetErrorString(error) says which launch and why; the rest do not
 * run). */
EMU_EXPORT int pytfm_emu_graph_launch(int64_t graph, int64_t begin, int64_t end) {
    std::vector<pytfm_emu::Recorded> *g = nullptr;
    {
        std::lock_guard<std::mutex> lock(pytfm_emu::graphs_lock);
        if (graph < 0 || graph >= (int64_t)pytfm_emu::graphs.size() || pytfm_emu::capturing)
            return cudaErrorInvalidValue;
        g = pytfm_emu::graphs[(size_t)graph];
    }
    if (!g) return cudaErrorInvalidValue;
    if (end < 0) end = (int64_t)g->size();
    if (begin < 0 || begin > end || end > (int64_t)g->size()) return cudaErrorInvalidValue;
    for (int64_t i = begin; i < end; i++) {
        const pytfm_emu::Recorded &r = (*g)[(size_t)i];
        pytfm_emu::run_launch(r.grid, r.block, r.shmem, r.body);
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
}

/* The message of the last failure (of a replay, say) */
EMU_EXPORT const char *pytfm_emu_error(void) { return pytfm_emu::last_message.c_str(); }

/* Free graph's recorded launches. */
EMU_EXPORT void pytfm_emu_graph_free(int64_t graph) {
    std::lock_guard<std::mutex> lock(pytfm_emu::graphs_lock);
    if (graph >= 0 && graph < (int64_t)pytfm_emu::graphs.size()) {
        delete pytfm_emu::graphs[(size_t)graph];
        pytfm_emu::graphs[(size_t)graph] = nullptr;
    }
}

/* cudaFuncSetAttribute: only the dynamic shared memory limit, 0 to 227 KiB (the GPU refuses
 * more with cudaErrorInvalidValue, and so does this). */
cudaError_t pytfm_emu_func_set_attribute(const void *func, enum cudaFuncAttribute attr,
                                         int value) {
    if (!func || attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        value > PYTFM_EMU_MAX_OPTIN_SHARED)
        return cudaErrorInvalidValue;
    std::lock_guard<std::mutex> lock(pytfm_emu::limits_lock);
    pytfm_emu::shared_limits[func] = value;
    return cudaSuccess;
}
