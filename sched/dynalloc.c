/*
 * The simulated arena of dynalloc.h: best-fit free lists over up to 16 chunks. Nothing
 * here touches device memory; the graph allocator turns each chunk's high-water mark into
 * a buffer once planning is done.
 */
#include "sched/dynalloc.h"

#include <stdint.h>
#include <string.h>

#define LOOM_DYN_INITIAL_BLOCKS 64

void loom__dyn_alloc_init(loom__dyn_alloc *a, size_t alignment, size_t max_chunk_size) {
    LOOM_ASSERT(alignment > 0 && (alignment & (alignment - 1)) == 0);
    memset(a, 0, sizeof(*a));
    a->alignment = alignment;
    /* half the address space at most, so offset + size never overflows */
    a->max_chunk_size = max_chunk_size < SIZE_MAX / 2 ? max_chunk_size : SIZE_MAX / 2;
    if (a->max_chunk_size == 0) a->max_chunk_size = SIZE_MAX / 2;
}

void loom__dyn_alloc_reset(loom__dyn_alloc *a) {
    for (int c = 0; c < LOOM_GALLOC_MAX_CHUNKS; c++) {
        a->chunks[c].n_blocks = 0;
        a->chunks[c].max_size = 0;
    }
    a->n_chunks = 0;
}

void loom__dyn_alloc_release(loom__dyn_alloc *a) {
    for (int c = 0; c < LOOM_GALLOC_MAX_CHUNKS; c++) {
        loom_free(a->chunks[c].blocks);
        a->chunks[c].blocks = NULL;
        a->chunks[c].cap_blocks = 0;
        a->chunks[c].n_blocks = 0;
        a->chunks[c].max_size = 0;
    }
    a->n_chunks = 0;
}

size_t loom__dyn_alloc_align(const loom__dyn_alloc *a, size_t size) {
    return (size + a->alignment - 1) & ~(a->alignment - 1);
}

/* Room for one more block in chunk c. */
static loom_status chunk_reserve(loom__dyn_chunk *ch) {
    if (ch->n_blocks < ch->cap_blocks) return LOOM_OK;
    int cap = ch->cap_blocks ? 2 * ch->cap_blocks : LOOM_DYN_INITIAL_BLOCKS;
    loom__free_block *b = loom_realloc(ch->blocks, (size_t)cap * sizeof(*b));
    if (!b) return loom_error(LOOM_ERR_NOMEM, "graph allocator: cannot grow a free list");
    ch->blocks = b;
    ch->cap_blocks = cap;
    return LOOM_OK;
}

static void block_insert(loom__dyn_chunk *ch, int at, size_t offset, size_t size) {
    memmove(&ch->blocks[at + 1], &ch->blocks[at],
            (size_t)(ch->n_blocks - at) * sizeof(ch->blocks[0]));
    ch->blocks[at].offset = offset;
    ch->blocks[at].size = size;
    ch->n_blocks++;
}

static void block_remove(loom__dyn_chunk *ch, int at) {
    memmove(&ch->blocks[at], &ch->blocks[at + 1],
            (size_t)(ch->n_blocks - at - 1) * sizeof(ch->blocks[0]));
    ch->n_blocks--;
}

static loom_status new_chunk(loom__dyn_alloc *a, size_t size, int *out) {
    if (a->n_chunks >= LOOM_GALLOC_MAX_CHUNKS) {
        return loom_error(LOOM_ERR_FULL,
                          "graph allocator: %zu more bytes need a chunk beyond the %d allowed",
                          size, LOOM_GALLOC_MAX_CHUNKS);
    }
    int c = a->n_chunks;
    loom__dyn_chunk *ch = &a->chunks[c];
    loom_status st = chunk_reserve(ch);
    if (st != LOOM_OK) return st;
    size_t chunk_size = size > a->max_chunk_size ? size : a->max_chunk_size;
    /* the last chunk is unbounded, so planning never fails for lack of chunks */
    if (c == LOOM_GALLOC_MAX_CHUNKS - 1) chunk_size = SIZE_MAX / 2;
    ch->n_blocks = 0;
    ch->max_size = 0;
    block_insert(ch, 0, 0, chunk_size);
    a->n_chunks++;
    *out = c;
    return LOOM_OK;
}

loom_status loom__dyn_alloc_alloc(loom__dyn_alloc *a, size_t size, loom__dyn_addr *out) {
    size = loom__dyn_alloc_align(a, size);
    int best_c = -1, best_b = -1;
    size_t best_size = SIZE_MAX;

    /* 1. best fit over interior blocks (every block but a chunk's tail); ties: later */
    for (int c = 0; c < a->n_chunks; c++) {
        const loom__dyn_chunk *ch = &a->chunks[c];
        for (int b = 0; b < ch->n_blocks - 1; b++) {
            const loom__free_block *blk = &ch->blocks[b];
            if (blk->size >= size && blk->size <= best_size) {
                best_c = c;
                best_b = b;
                best_size = blk->size;
            }
        }
    }

    /* 2. tail blocks: while every candidate grows its chunk, prefer the least growth;
     *    once one fits under its high-water mark, prefer the tightest such fit */
    if (best_c < 0) {
        int64_t best_reuse = INT64_MIN;
        for (int c = 0; c < a->n_chunks; c++) {
            const loom__dyn_chunk *ch = &a->chunks[c];
            if (ch->n_blocks == 0) continue;
            const loom__free_block *blk = &ch->blocks[ch->n_blocks - 1];
            if (blk->size < size) continue;
            int64_t reuse = (int64_t)ch->max_size - (int64_t)blk->offset - (int64_t)size;
            bool better_reuse = best_reuse < 0 && reuse > best_reuse;
            bool better_fit = reuse >= 0 && reuse < best_reuse;
            if (better_reuse || better_fit) {
                best_c = c;
                best_b = ch->n_blocks - 1;
                best_reuse = reuse;
            }
        }
    }

    /* 3. a new chunk */
    if (best_c < 0) {
        loom_status st = new_chunk(a, size, &best_c);
        if (st != LOOM_OK) return st;
        best_b = 0;
    }

    loom__dyn_chunk *ch = &a->chunks[best_c];
    loom__free_block *blk = &ch->blocks[best_b];
    out->chunk = best_c;
    out->offset = blk->offset;
    blk->offset += size;
    blk->size -= size;
    if (blk->size == 0) block_remove(ch, best_b);
    if (out->offset + size > ch->max_size) ch->max_size = out->offset + size;
    return LOOM_OK;
}

loom_status loom__dyn_alloc_free(loom__dyn_alloc *a, loom__dyn_addr addr, size_t size) {
    LOOM_ASSERT(addr.chunk >= 0 && addr.chunk < a->n_chunks);
    size = loom__dyn_alloc_align(a, size);
    if (size == 0) return LOOM_OK;
    loom__dyn_chunk *ch = &a->chunks[addr.chunk];
    size_t end = addr.offset + size;

    /* first block at or after the freed range */
    int i = 0;
    while (i < ch->n_blocks && ch->blocks[i].offset < addr.offset)
        i++;
    LOOM_ASSERT(i == ch->n_blocks || ch->blocks[i].offset >= end); /* no double free */
    bool merge_prev = i > 0 && ch->blocks[i - 1].offset + ch->blocks[i - 1].size == addr.offset;
    bool merge_next = i < ch->n_blocks && ch->blocks[i].offset == end;
    LOOM_ASSERT(i == 0 || ch->blocks[i - 1].offset + ch->blocks[i - 1].size <= addr.offset);

    if (merge_prev && merge_next) {
        ch->blocks[i - 1].size += size + ch->blocks[i].size;
        block_remove(ch, i);
    } else if (merge_prev) {
        ch->blocks[i - 1].size += size;
    } else if (merge_next) {
        ch->blocks[i].offset = addr.offset;
        ch->blocks[i].size += size;
    } else {
        loom_status st = chunk_reserve(ch);
        if (st != LOOM_OK) return st;
        block_insert(ch, i, addr.offset, size);
    }
    return LOOM_OK;
}
