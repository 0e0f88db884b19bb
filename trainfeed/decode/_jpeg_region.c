/* Decodes one rectangle of a JPEG with libjpeg-turbo, and nothing below it.
 *
 * Why this exists: a RandomResizedCrop keeps on average under half of an image (scale 0.08-1),
 * and the crop is all the trainer sees. libjpeg-turbo can decode a region: rows above it are
 * skipped (entropy-decoded only, no IDCT, upsampling or colour conversion: jpeg_skip_scanlines),
 * columns outside it are not reconstructed (jpeg_crop_scanline, to the iMCU boundary at its
 * left), and decoding stops after its last row. This is what tf.data's decode_and_crop_jpeg and
 * DALI's ROI decoder do; no maintained Python binding offers it (docs/imagenet.md), so this is a
 * thin wrapper of the libjpeg API: the Python side (trainfeed/decode/roi.py) plans the window,
 * resizes and flips.
 *
 * decode_region(data, out, left, top, width, height, scale, channels, fast_dct, max_pixels=0)
 *     -> (row, dx)
 *   data:     the JPEG (any object with the buffer protocol)
 *   out:      a writable, C-contiguous buffer of at least height * (width + 64) * channels bytes
 *   left, top, width, height: the window, in pixels of the image scaled by 1/scale
 *   scale:    1, 2, 4 or 8 (libjpeg's DCT-domain scaling)
 *   channels: 3 (RGB) or 1 (grey)
 *   max_pixels: the pixel budget, 0 for none (the default). A JPEG whose frame declares more
 *             pixels (width x height, unscaled) raises PixelBudgetError (a ValueError) before
 *             anything is allocated: a 600-byte file may declare 65,535 x 65,535, and a
 *             progressive one holds every DCT coefficient of the image (2 bytes per sample)
 *             however small the window. add_restarts takes the same argument.
 * Writes `height` rows of `row` pixels each, contiguous; the window's first column is column
 * `dx` of them (the region starts at an iMCU boundary). Raises ValueError with libjpeg's message
 * on data that libjpeg finds damaged: its warnings are errors here, as in simplejpeg's strict
 * mode, so a truncated stream, a bad Huffman code or a marker out of place raises instead of
 * decoding to grey. Not every damage is visible to libjpeg: a flipped bit inside entropy-coded
 * data mostly decodes to other valid codes, and so to wrong pixels without an error. Those are
 * caught before decoding by the checksum of every stored value (CRC-32C, or Parquet's CRC-32:
 * trainfeed/formats/shards.py), not here. More than 500 scans (a progressive CPU bomb) raise
 * ValueError too, as TurboJPEG's scan limit does. MemoryError when an allocation fails. The GIL
 * is released while decoding.
 *
 * Memory safety: every buffer here is owned by the function that allocates it and freed on its
 * one exit path, whatever libjpeg did (its errors longjmp out of any depth); writers check their
 * capacity. tools/sanitize_jpeg_region.sh builds this file with ASan and UBSan and fuzzes every
 * entry point (docs/testing.md).
 */
#define PY_SSIZE_T_CLEAN
#ifndef JPEG_REGION_NO_PYTHON /* tools/fuzz/fuzz_jpeg_region.c: the C core alone, no Python */
#include <Python.h>
#endif

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

#ifndef LIBJPEG_TURBO_VERSION_NUMBER
#error "trainfeed's region decoder needs libjpeg-turbo (jpeg_crop_scanline, jpeg_skip_scanlines)"
#endif

/* How far jpeg_crop_scanline may move the left edge (an iMCU is at most 32 pixels wide at
 * 4:1:1 sampling) plus EDGE on both sides: the caller's margin. */
#define REGION_MARGIN 64
/* Pixels decoded beyond the window on either side (see decode). */
#define EDGE 4
/* Scans a JPEG may have: each one is a pass over all of the image's coefficients, so a small
 * progressive file of thousands of scans is a CPU bomb. TurboJPEG's scan limit is also 500
 * (TJFLAG_LIMITSCANS); encoders write about 10. */
#define MAX_SCANS 500

/* What the C functions below return. */
enum { DONE = 0, FAILED = -1, OVER_BUDGET = -2, NO_MEMORY = -3 };

typedef struct {
    struct jpeg_error_mgr manager;
    jmp_buf escape;
    char message[JMSG_LENGTH_MAX];
} StrictErrors;

static void fail(j_common_ptr info) {
    StrictErrors *errors = (StrictErrors *)info->err;
    (*info->err->format_message)(info, errors->message);
    longjmp(errors->escape, 1);
}

static void warn_as_error(j_common_ptr info, int level) {
    if (level < 0) { /* a warning: corrupt data that libjpeg would paper over */
        fail(info);
    }
}

/* libjpeg's error manager with warnings as errors and the message kept for ValueError, for
 * every libjpeg object of one call (they share the escape).
 *
 * Each function that sets the escape (decode, transcode) has one exit path below its setjmp,
 * which destroys the libjpeg objects it created and frees what it allocated. Those objects, and
 * the output buffer, are reached through pointers libjpeg holds, so they live in memory, not in
 * registers, across the longjmp; the flags saying what exists are volatile. */
static struct jpeg_error_mgr *strict_errors(StrictErrors *errors) {
    struct jpeg_error_mgr *manager = jpeg_std_error(&errors->manager);
    manager->error_exit = fail;
    manager->emit_message = warn_as_error;
    errors->message[0] = '\0';
    return manager;
}

static void limit_scans(j_common_ptr info) {
    if (info->is_decompressor && ((j_decompress_ptr)info)->input_scan_number > MAX_SCANS) {
        StrictErrors *errors = (StrictErrors *)info->err;
        snprintf(errors->message, JMSG_LENGTH_MAX, "the JPEG has more than %d scans", MAX_SCANS);
        longjmp(errors->escape, 1);
    }
}

/* Gives a created decompressor the scan limit and `data` as its source. (Created first, and
 * said so, by the caller: jpeg_mem_src may longjmp already, on empty data.) */
static void read_from(j_decompress_ptr info, struct jpeg_progress_mgr *progress,
                      const unsigned char *data, size_t size) {
    progress->progress_monitor = limit_scans;
    info->progress = progress;
    jpeg_mem_src(info, data, (unsigned long)size);
}

/* 1, and the message, if the frame (width x height as declared: libjpeg allocates for that,
 * whatever is decoded of it) has more pixels than max_pixels (0: no budget). */
static int over_budget(unsigned int width, unsigned int height, unsigned long long max_pixels,
                       char *message) {
    if (max_pixels == 0 || (unsigned long long)width * height <= max_pixels) {
        return 0;
    }
    snprintf(message, JMSG_LENGTH_MAX, "the JPEG declares %ux%u pixels, over the budget of %llu",
             width, height, max_pixels);
    return 1;
}

static int decode(const unsigned char *data, size_t size, unsigned char *out, size_t capacity,
                  JDIMENSION left, JDIMENSION top, JDIMENSION width, JDIMENSION height,
                  unsigned int scale, int channels, int fast_dct, unsigned long long max_pixels,
                  JDIMENSION *row, JDIMENSION *dx, char *message) {
    struct jpeg_decompress_struct info;
    struct jpeg_progress_mgr progress;
    StrictErrors errors;
    volatile int created = 0, status = FAILED;

    info.err = strict_errors(&errors);
    if (setjmp(errors.escape)) {
        snprintf(message, JMSG_LENGTH_MAX, "%s", errors.message);
        goto finish;
    }
    jpeg_create_decompress(&info);
    created = 1;
    read_from(&info, &progress, data, size);
    jpeg_read_header(&info, TRUE);
    if (over_budget(info.image_width, info.image_height, max_pixels, message)) {
        status = OVER_BUDGET; /* before jpeg_start_decompress allocates */
        goto finish;
    }
    if (info.jpeg_color_space == JCS_CMYK || info.jpeg_color_space == JCS_YCCK) {
        snprintf(message, JMSG_LENGTH_MAX, "CMYK JPEGs are decoded whole");
        goto finish;
    }
    info.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    info.scale_num = 1;
    info.scale_denom = scale;
    info.dct_method = fast_dct ? JDCT_IFAST : JDCT_ISLOW;
    jpeg_start_decompress(&info);
    if (left + width > info.output_width || top + height > info.output_height
            || width == 0 || height == 0) {
        snprintf(message, JMSG_LENGTH_MAX,
                 "window %ux%u at (%u, %u) outside the %ux%u image (scaled by 1/%u)",
                 width, height, left, top, info.output_width, info.output_height, scale);
        goto finish;
    }
    /* A few pixels more on each side: at the region's own edges libjpeg's fancy upsampling has
     * no chroma neighbour (up to 31 levels off in the edge column, measured), inside it does. */
    JDIMENSION offset = left > EDGE ? left - EDGE : 0;
    JDIMENSION end = left + width + EDGE < info.output_width ? left + width + EDGE
                                                             : info.output_width;
    JDIMENSION cropped = end - offset;
    if (cropped < info.output_width) {
        jpeg_crop_scanline(&info, &offset, &cropped);
    }
    if ((size_t)cropped * height * channels > capacity || left - offset > REGION_MARGIN / 2 + EDGE
            || info.output_width != cropped || info.output_components != channels) {
        snprintf(message, JMSG_LENGTH_MAX, "region buffer too small for %u columns", cropped);
        goto finish;
    }
    if (top > 0 && jpeg_skip_scanlines(&info, top) != top) {
        snprintf(message, JMSG_LENGTH_MAX, "could not skip to row %u", top);
        goto finish;
    }
    size_t stride = (size_t)cropped * channels;
    for (JDIMENSION done = 0; done < height;) {
        JSAMPROW rows[4];
        JDIMENSION want = height - done < 4 ? height - done : 4;
        for (JDIMENSION i = 0; i < want; i++) {
            rows[i] = out + (done + i) * stride;
        }
        JDIMENSION got = jpeg_read_scanlines(&info, rows, want);
        if (got == 0) {
            snprintf(message, JMSG_LENGTH_MAX, "the JPEG ended at row %u", top + done);
            goto finish;
        }
        done += got;
    }
    *row = cropped;
    *dx = left - offset;
    status = DONE;
finish:
    if (created) {
        jpeg_destroy_decompress(&info); /* the rows below the window are never decoded */
    }
    return status;
}

/* ---- Restart-indexed JPEGs: a window without entropy-decoding the rest of the image ----------
 *
 * In a plain JPEG every block above the window, and beside it in the window's rows, must be
 * entropy-decoded (Huffman codes have no boundaries to jump to): on ImageNet-like photos that
 * is most of the cost of a RandomResizedCrop window (0.8 ms of a 1.05 ms whole decode for a
 * window of ~40 % of the image). Restart markers make the entropy-coded data a sequence of
 * independently decodable intervals of R MCUs (the DC predictors restart at each), found by a
 * byte scan. When R divides the MCUs of a row, the intervals that cover the window, row by
 * row, are themselves a valid JPEG of the MCU-aligned sub-image: the same tables, the frame's
 * size patched, the intervals copied and their markers renumbered. Decoding that decodes the
 * same coefficients, so its pixels are the whole decode's (bit-exact, tested), at the cost of
 * roughly the window's own area.
 *
 * add_restarts rewrites a JPEG with such restart markers, losslessly (the DCT coefficients are
 * copied, not re-quantized; the source's Huffman tables kept when complete, else optimized: see
 * reuse_huffman_tables), for `trainfeed upload --jpeg-restarts`.
 * Any JPEG that already has a fitting layout takes the fast path too; anything else (no
 * restarts, progressive or multi-scan, arithmetic coding, an interval that does not divide the
 * rows, a damaged layout) decodes the whole-stream way, which is never wrong. */

typedef struct {
    size_t scan_start;      /* first byte of entropy-coded data */
    unsigned int width, height, mcu_width, mcu_height, mcus_per_row, mcu_rows, interval;
} RestartLayout;

static unsigned int ceil_div(unsigned int a, unsigned int b) { return (a + b - 1) / b; }

static unsigned int segment_length(const unsigned char *data, size_t at) {
    return ((unsigned int)data[at + 2] << 8) | data[at + 3];
}

/* 1 and the marker and length of the header segment at data[*at] (after any fill bytes, which
 * move *at); 0 when there is none within `size`: the end, a standalone marker (TEM, RSTn, SOI,
 * EOI) where a segment belongs, or a length shorter than its own field or past the end. */
static int header_segment(const unsigned char *data, size_t size, size_t *at,
                          unsigned char *marker, unsigned int *length) {
    while (*at + 4 <= size && data[*at] == 0xFF && data[*at + 1] == 0xFF) {
        (*at)++; /* a fill byte before a marker */
    }
    if (*at + 4 > size || data[*at] != 0xFF) {
        return 0;
    }
    *marker = data[*at + 1];
    *length = segment_length(data, *at);
    return !(*marker == 0x01 || (*marker >= 0xD0 && *marker <= 0xD9) || *length < 2
             || *at + 2 + *length > size);
}

/* 1 and the layout for a single-scan, Huffman-coded sequential JPEG whose restart interval
 * divides its MCU rows; 0 for anything else, or on any doubt. Reads only within `size`. */
static int restart_layout(const unsigned char *data, size_t size, RestartLayout *layout) {
    unsigned int components = 0, hmax = 1, vmax = 1, interval = 0, length = 0;
    int have_frame = 0;
    unsigned char marker = 0;
    if (size < 4 || data[0] != 0xFF || data[1] != 0xD8) {
        return 0;
    }
    for (size_t at = 2; header_segment(data, size, &at, &marker, &length); at += 2 + length) {
        const unsigned char *body = data + at + 4;
        if (marker == 0xC0 || marker == 0xC1) { /* baseline or extended sequential, Huffman */
            if (have_frame || length < 8) {
                return 0;
            }
            components = body[5];
            if (body[0] != 8 || components < 1 || components > 4 || length != 8 + 3 * components) {
                return 0;
            }
            layout->height = ((unsigned int)body[1] << 8) | body[2];
            layout->width = ((unsigned int)body[3] << 8) | body[4];
            for (unsigned int c = 0; c < components; c++) {
                unsigned int h = body[7 + 3 * c] >> 4, v = body[7 + 3 * c] & 15;
                if (h < 1 || h > 4 || v < 1 || v > 4) {
                    return 0;
                }
                hmax = h > hmax ? h : hmax;
                vmax = v > vmax ? v : vmax;
            }
            have_frame = 1;
        } else if (marker >= 0xC2 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8) {
            return 0; /* progressive, lossless, arithmetic-coded (and DAC): not for this path */
        } else if (marker == 0xDD) {
            if (length != 4) {
                return 0;
            }
            interval = ((unsigned int)body[0] << 8) | body[1];
        } else if (marker == 0xDA) {
            if (!have_frame || length < 6 || body[0] != components) {
                return 0; /* the scan must hold every component (one interleaved scan) */
            }
            layout->scan_start = at + 2 + length;
            break;
        }
    }
    if (layout->scan_start == 0 || layout->width == 0 || layout->height == 0 || interval == 0) {
        return 0;
    }
    /* One component: an MCU is one 8x8 block; several: hmax x vmax blocks of the largest. */
    layout->mcu_width = components == 1 ? 8 : 8 * hmax;
    layout->mcu_height = components == 1 ? 8 : 8 * vmax;
    layout->mcus_per_row = ceil_div(layout->width, layout->mcu_width);
    layout->mcu_rows = ceil_div(layout->height, layout->mcu_height);
    layout->interval = interval;
    return layout->mcus_per_row % interval == 0;
}

/* 1 and the frame's (height, width) from the first SOF segment of any JPEG process (baseline,
 * progressive, lossless, arithmetic); 0 if there is none before the first scan or the markers
 * are damaged. Reads only within `size`. ~0.2 us: cheaper than the round trip of releasing and
 * taking back the GIL, so it runs with the GIL held. */
static int frame_size(const unsigned char *data, size_t size, unsigned int *height,
                      unsigned int *width) {
    unsigned int length = 0;
    unsigned char marker = 0;
    if (size < 4 || data[0] != 0xFF || data[1] != 0xD8) {
        return 0;
    }
    for (size_t at = 2; header_segment(data, size, &at, &marker, &length); at += 2 + length) {
        if (marker == 0xDA) {
            return 0; /* a scan before any frame */
        }
        if (marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8
                && marker != 0xCC) {
            if (length < 8) {
                return 0;
            }
            *height = ((unsigned int)data[at + 5] << 8) | data[at + 6];
            *width = ((unsigned int)data[at + 7] << 8) | data[at + 8];
            return *height > 0 && *width > 0;
        }
    }
    return 0;
}

/* A byte buffer that refuses to overflow: put() copies only what fits (0 when it would not). */
typedef struct {
    unsigned char *bytes;
    size_t used, capacity;
} Writer;

static int put(Writer *out, const unsigned char *bytes, size_t count) {
    if (count > out->capacity - out->used) {
        return 0;
    }
    memcpy(out->bytes + out->used, bytes, count);
    out->used += count;
    return 1;
}

/* Copies the scan's intervals in rows [top, bottom) and columns [first, last) (in intervals) to
 * `out`, renumbering their markers, scanning no further than the window's last interval. 0
 * unless the markers come in sequence, the scan has `per_row * mcu_rows` intervals (EOI ends the
 * last, when the window reaches it) and everything fits. */
static int copy_intervals(const unsigned char *data, size_t size, const RestartLayout *layout,
                          size_t per_row, size_t first, size_t last, size_t top, size_t bottom,
                          Writer *out) {
    size_t count = per_row * layout->mcu_rows;
    size_t needed = (bottom - 1) * per_row + last; /* through the window's last */
    size_t found = 0, copied = 0, at = layout->scan_start, begin = at;
    while (at < size) {
        const unsigned char *next = memchr(data + at, 0xFF, size - at);
        if (next == NULL || (size_t)(next - data) + 1 >= size) {
            return 0;
        }
        size_t marker_at = (size_t)(next - data);
        unsigned char marker = data[marker_at + 1];
        if (marker == 0x00) { /* a stuffed 0xFF data byte */
            at = marker_at + 2;
            continue;
        }
        if (marker == 0xFF) { /* fill byte */
            at = marker_at + 1;
            continue;
        }
        int restart = marker >= 0xD0 && marker <= 0xD7;
        if (restart ? marker != 0xD0 + (found & 7) || found + 1 >= count
                    : marker != 0xD9 || found + 1 != count) {
            return 0;
        }
        /* interval `found` is data[begin, marker_at) */
        size_t row = found / per_row, column = found % per_row;
        if (row >= top && column >= first && column < last) {
            unsigned char renumbered[2] = {0xFF, (unsigned char)(0xD0 + ((copied - 1) & 7))};
            if ((copied > 0 && !put(out, renumbered, 2))
                    || !put(out, data + begin, marker_at - begin)) {
                return 0;
            }
            copied++;
        }
        if (++found == needed) { /* the rows below are never decoded: not scanned either */
            return 1;
        }
        begin = at = marker_at + 2;
    }
    return 0;
}

/* The JPEG of the MCU-aligned sub-image holding pixels [x0, x1) x [y0, y1) (unscaled), and its
 * origin: DONE and a malloc'd buffer of *out_size bytes in *result (the caller frees it);
 * FAILED when `data` has no fitting restart layout or the sub-image would be the image (decode
 * the whole stream then); NO_MEMORY. Never more than size + 4 bytes: a subset of the header
 * segments and intervals, each interval's marker renumbered, SOI and EOI. Needs no GIL. */
static int restart_subimage(const unsigned char *data, size_t size, unsigned int x0,
                            unsigned int y0, unsigned int x1, unsigned int y1,
                            unsigned char **result, size_t *out_size, unsigned int *origin_x,
                            unsigned int *origin_y) {
    RestartLayout layout = {0};
    if (!restart_layout(data, size, &layout)) {
        return FAILED;
    }
    x1 = x1 < layout.width ? x1 : layout.width;
    y1 = y1 < layout.height ? y1 : layout.height;
    if (x0 >= x1 || y0 >= y1) {
        return FAILED;
    }
    size_t per_row = layout.mcus_per_row / layout.interval; /* intervals per MCU row */
    size_t first = x0 / layout.mcu_width / layout.interval;
    size_t last = ceil_div(ceil_div(x1, layout.mcu_width), layout.interval);
    size_t top = y0 / layout.mcu_height, bottom = ceil_div(y1, layout.mcu_height);
    /* (each interval takes at least 3 bytes: one of data, its marker) */
    if ((first == 0 && last == per_row && top == 0) || per_row * layout.mcu_rows > size / 3) {
        return FAILED; /* nothing to skip but what the plain path skips; or a lie about sizes */
    }
    Writer out = {malloc(size + 4), 0, size + 4};
    if (out.bytes == NULL) {
        return NO_MEMORY;
    }
    /* The header: every segment but metadata (APP1-13, APP15, COM); JFIF's APP0 and Adobe's
     * APP14 stay, since they decide the colour space. The frame's size is patched. */
    unsigned int width = (unsigned int)((last * layout.interval * layout.mcu_width < layout.width
                                         ? last * layout.interval * layout.mcu_width
                                         : layout.width)
                                        - first * layout.interval * layout.mcu_width);
    unsigned int height = (unsigned int)((bottom * layout.mcu_height < layout.height
                                          ? bottom * layout.mcu_height : layout.height)
                                         - top * layout.mcu_height);
    static const unsigned char soi[2] = {0xFF, 0xD8}, eoi[2] = {0xFF, 0xD9};
    int written = put(&out, soi, 2);
    unsigned char marker = 0;
    unsigned int length = 0;
    for (size_t at = 2; written && at < layout.scan_start
                        && header_segment(data, size, &at, &marker, &length); at += 2 + length) {
        int metadata = (marker >= 0xE1 && marker <= 0xED) || marker == 0xEF || marker == 0xFE;
        if (metadata) {
            continue;
        }
        size_t frame = out.used;
        written = put(&out, data + at, 2 + length);
        if (written && (marker == 0xC0 || marker == 0xC1)) {
            written = length >= 8; /* (restart_layout checked it: every frame is whole) */
            if (written) {
                out.bytes[frame + 5] = (unsigned char)(height >> 8);
                out.bytes[frame + 6] = (unsigned char)(height & 0xFF);
                out.bytes[frame + 7] = (unsigned char)(width >> 8);
                out.bytes[frame + 8] = (unsigned char)(width & 0xFF);
            }
        }
    }
    if (!written || !copy_intervals(data, size, &layout, per_row, first, last, top, bottom, &out)
            || !put(&out, eoi, 2)) {
        free(out.bytes);
        return FAILED;
    }
    *result = out.bytes;
    *out_size = out.used;
    *origin_x = (unsigned int)(first * layout.interval * layout.mcu_width);
    *origin_y = (unsigned int)(top * layout.mcu_height);
    return DONE;
}

/* ---- Output: a growing buffer this file owns ---------------------------------------------------
 * Not jpeg_mem_dest: that one frees and replaces the caller's buffer as the output grows past
 * 4 KiB, and writes the new address back only when compression finishes, so after an error the
 * caller holds a freed pointer and the live buffer is lost (add_restarts freed it twice: issue
 * 25). This one keeps the buffer where transcode's exit path frees it, whatever happened. */
typedef struct {
    struct jpeg_destination_mgr manager;
    unsigned char *bytes; /* NULL, or malloc'd: `capacity` bytes */
    size_t capacity;
} Output;

#define OUTPUT_START 4096 /* bytes; doubled as needed */

static void output_start(j_compress_ptr info) {
    Output *out = (Output *)info->dest;
    if (out->bytes == NULL) {
        out->bytes = malloc(OUTPUT_START);
        if (out->bytes == NULL) {
            ERREXIT1(info, JERR_OUT_OF_MEMORY, 10);
        }
        out->capacity = OUTPUT_START;
    }
    out->manager.next_output_byte = out->bytes;
    out->manager.free_in_buffer = out->capacity;
}

static boolean output_grow(j_compress_ptr info) { /* called when the buffer is full */
    Output *out = (Output *)info->dest;
    size_t capacity = 2 * out->capacity;
    unsigned char *grown = capacity > out->capacity ? realloc(out->bytes, capacity) : NULL;
    if (grown == NULL) {
        ERREXIT1(info, JERR_OUT_OF_MEMORY, 11); /* out->bytes is still ours, and freed */
    }
    out->manager.next_output_byte = grown + out->capacity;
    out->manager.free_in_buffer = capacity - out->capacity;
    out->bytes = grown;
    out->capacity = capacity;
    return TRUE;
}

static void output_end(j_compress_ptr info) { (void)info; }

/* Whether Huffman table `table` codes every symbol a baseline 8-bit scan can need: categories
 * 0-11 for a DC table; EOB, ZRL and every (run 0-15, size 1-10) for an AC table. A rewrite can
 * then reuse it as it is: restart markers reset the DC predictor (a difference becomes a whole
 * DC value, maybe of a category the source never used) but change nothing else, and a complete
 * table codes anything. libjpeg-turbo does not check at encode time that a symbol has a code,
 * so an incomplete table is never reused. */
static int huffman_table_complete(const JHUFF_TBL *table, int ac) {
    if (table == NULL) {
        return 0;
    }
    unsigned char present[256] = {0};
    int count = 0;
    for (int length = 1; length <= 16; length++) {
        count += table->bits[length];
    }
    if (count > 256) {
        return 0;
    }
    for (int i = 0; i < count; i++) {
        present[table->huffval[i]] = 1;
    }
    if (!ac) {
        for (int category = 0; category <= 11; category++) {
            if (!present[category]) {
                return 0;
            }
        }
        return 1;
    }
    if (!present[0x00] || !present[0xF0]) {
        return 0;
    }
    for (int run = 0; run < 16; run++) {
        for (int bits = 1; bits <= 10; bits++) {
            if (!present[(run << 4) | bits]) {
                return 0;
            }
        }
    }
    return 1;
}

/* Gives the sink the source's Huffman tables and returns 1 when every table a component of a
 * baseline (sequential, 8-bit) source uses is complete (see huffman_table_complete); else 0
 * and the sink keeps libjpeg's, to be optimized. Reusing them skips optimize_coding's first
 * pass over every coefficient: 2.2x the rewrites per second on ImageNet-like photos (380 ->
 * 840 per CPU-second), and the output keeps the source's tables (Pillow, cameras: the
 * standard ones). */
static int reuse_huffman_tables(j_decompress_ptr source, j_compress_ptr sink) {
    if (source->progressive_mode || source->arith_code || source->data_precision != 8) {
        return 0;
    }
    for (int c = 0; c < source->num_components; c++) {
        const jpeg_component_info *component = &source->comp_info[c];
        if (component->dc_tbl_no < 0 || component->dc_tbl_no >= NUM_HUFF_TBLS
                || component->ac_tbl_no < 0 || component->ac_tbl_no >= NUM_HUFF_TBLS
                || !huffman_table_complete(source->dc_huff_tbl_ptrs[component->dc_tbl_no], 0)
                || !huffman_table_complete(source->ac_huff_tbl_ptrs[component->ac_tbl_no], 1)) {
            return 0;
        }
    }
    for (int t = 0; t < NUM_HUFF_TBLS; t++) {
        JHUFF_TBL **tables[2][2] = {{&source->dc_huff_tbl_ptrs[t], &sink->dc_huff_tbl_ptrs[t]},
                                    {&source->ac_huff_tbl_ptrs[t], &sink->ac_huff_tbl_ptrs[t]}};
        for (int k = 0; k < 2; k++) {
            JHUFF_TBL *from = *tables[k][0];
            if (from == NULL) {
                continue;
            }
            if (*tables[k][1] == NULL) {
                *tables[k][1] = jpeg_alloc_huff_table((j_common_ptr)sink);
            }
            memcpy((*tables[k][1])->bits, from->bits, sizeof(from->bits));
            memcpy((*tables[k][1])->huffval, from->huffval, sizeof(from->huffval));
            (*tables[k][1])->sent_table = FALSE;
        }
    }
    for (int c = 0; c < sink->num_components; c++) {
        sink->comp_info[c].dc_tbl_no = source->comp_info[c].dc_tbl_no;
        sink->comp_info[c].ac_tbl_no = source->comp_info[c].ac_tbl_no;
    }
    return 1;
}

/* Rewrites a JPEG with a restart marker every `interval` MCUs, the largest divisor of its MCUs
 * per row spanning at most `target` pixels (at least one MCU), losslessly: see add_restarts.
 * DONE and a malloc'd *result of *result_size bytes (the caller frees it), or FAILED /
 * OVER_BUDGET with *result untouched and `message` set. */
static int transcode(const unsigned char *data, size_t size, unsigned int target,
                     unsigned long long max_pixels, unsigned char **result, size_t *result_size,
                     char *message) {
    struct jpeg_decompress_struct source;
    struct jpeg_compress_struct sink;
    struct jpeg_progress_mgr progress;
    StrictErrors errors;
    Output output = {{0}, NULL, 0};
    volatile int have_source = 0, have_sink = 0, status = FAILED;

    output.manager.init_destination = output_start;
    output.manager.empty_output_buffer = output_grow;
    output.manager.term_destination = output_end;
    source.err = sink.err = strict_errors(&errors);
    if (setjmp(errors.escape)) {
        snprintf(message, JMSG_LENGTH_MAX, "%s", errors.message);
        goto finish;
    }
    jpeg_create_decompress(&source);
    have_source = 1;
    read_from(&source, &progress, data, size);
    jpeg_save_markers(&source, JPEG_COM, 0xFFFF);
    for (int app = 0; app < 16; app++) {
        jpeg_save_markers(&source, JPEG_APP0 + app, 0xFFFF);
    }
    jpeg_read_header(&source, TRUE);
    if (over_budget(source.image_width, source.image_height, max_pixels, message)) {
        status = OVER_BUDGET; /* before jpeg_read_coefficients allocates them all */
        goto finish;
    }
    if (source.jpeg_color_space == JCS_CMYK || source.jpeg_color_space == JCS_YCCK) {
        snprintf(message, JMSG_LENGTH_MAX, "CMYK JPEGs are kept as they are");
        goto finish;
    }
    jvirt_barray_ptr *coefficients = jpeg_read_coefficients(&source);
    jpeg_create_compress(&sink);
    have_sink = 1;
    sink.dest = &output.manager;
    jpeg_copy_critical_parameters(&source, &sink);
    sink.optimize_coding = !reuse_huffman_tables(&source, &sink);
    unsigned int mcu_width = source.num_components == 1 ? 8 : 8 * source.max_h_samp_factor;
    unsigned int mcus = ceil_div(source.image_width, mcu_width);
    unsigned int interval = target / mcu_width > 1 ? target / mcu_width : 1;
    interval = interval < mcus ? interval : mcus;
    while (mcus % interval != 0) {
        interval--;
    }
    sink.restart_interval = interval;
    jpeg_write_coefficients(&sink, coefficients);
    for (jpeg_saved_marker_ptr marker = source.marker_list; marker; marker = marker->next) {
        /* jpeg_write_coefficients wrote its own JFIF or Adobe marker: not twice. */
        if ((sink.write_JFIF_header && marker->marker == JPEG_APP0 && marker->data_length >= 5
             && memcmp(marker->data, "JFIF", 5) == 0)
                || (sink.write_Adobe_marker && marker->marker == JPEG_APP0 + 14
                    && marker->data_length >= 5 && memcmp(marker->data, "Adobe", 5) == 0)) {
            continue;
        }
        jpeg_write_marker(&sink, marker->marker, marker->data, marker->data_length);
    }
    jpeg_finish_compress(&sink);
    jpeg_finish_decompress(&source);
    *result = output.bytes;
    *result_size = output.capacity - output.manager.free_in_buffer;
    output.bytes = NULL; /* the caller's now */
    status = DONE;
finish:
    if (have_sink) {
        jpeg_destroy_compress(&sink);
    }
    if (have_source) {
        jpeg_destroy_decompress(&source);
    }
    free(output.bytes);
    return status;
}

/* decode_region's work, without the GIL: the window from its restart intervals alone when the
 * JPEG has a fitting layout, else (or if that fails) from the whole stream. */
static int decode_window(const unsigned char *data, size_t size, unsigned char *out,
                         size_t capacity, unsigned int left, unsigned int top, unsigned int width,
                         unsigned int height, unsigned int k, int channels, int fast_dct,
                         unsigned long long max_pixels, JDIMENSION *row, JDIMENSION *dx,
                         char *message) {
    unsigned int frame_height = 0, frame_width = 0;
    if (max_pixels > 0 && frame_size(data, size, &frame_height, &frame_width)
            && over_budget(frame_width, frame_height, max_pixels, message)) {
        return OVER_BUDGET; /* the sub-image would be smaller: refused all the same */
    }
    /* The intervals around the window (EDGE more on each side, in unscaled pixels). */
    unsigned int origin_x = 0, origin_y = 0, x0 = left * k, y0 = top * k;
    unsigned char *sub = NULL;
    size_t sub_size = 0;
    int status = restart_subimage(data, size, x0 > EDGE * k ? x0 - EDGE * k : 0,
                                  y0 > EDGE * k ? y0 - EDGE * k : 0, (left + width + EDGE) * k,
                                  (top + height + EDGE) * k, &sub, &sub_size, &origin_x,
                                  &origin_y);
    if (status == NO_MEMORY) {
        return NO_MEMORY;
    }
    if (status == DONE) {
        status = decode(sub, sub_size, out, capacity, left - origin_x / k, top - origin_y / k,
                        width, height, k, channels, fast_dct, max_pixels, row, dx, message);
        free(sub);
        if (status == DONE || status == OVER_BUDGET) {
            return status;
        }
    }
    return decode(data, size, out, capacity, left, top, width, height, k, channels, fast_dct,
                  max_pixels, row, dx, message);
}

#ifndef JPEG_REGION_NO_PYTHON
/* ---- The Python entry points --------------------------------------------------------------- */

static PyObject *PixelBudgetError; /* a ValueError: the module's attribute */

/* Sets the exception for a C function's status (not DONE) and message; returns NULL. */
static PyObject *set_error(int status, const char *message) {
    if (status == NO_MEMORY) {
        return PyErr_NoMemory();
    }
    PyErr_SetString(status == OVER_BUDGET ? PixelBudgetError : PyExc_ValueError, message);
    return NULL;
}

/* max_pixels: None or 0 (no budget), or a positive int; 0 and the exception if not. */
static int parse_budget(PyObject *value, unsigned long long *max_pixels) {
    *max_pixels = 0;
    if (value == NULL || value == Py_None) {
        return 1;
    }
    long long pixels = PyLong_AsLongLong(value);
    if (pixels == -1 && PyErr_Occurred()) {
        return 0;
    }
    if (pixels < 0) {
        PyErr_Format(PyExc_ValueError, "max_pixels must be >= 0 (0: no budget), got %lld",
                     pixels);
        return 0;
    }
    *max_pixels = (unsigned long long)pixels;
    return 1;
}

static PyObject *add_restarts(PyObject *Py_UNUSED(module), PyObject *args, PyObject *keywords) {
    static char *names[] = {"", "", "max_pixels", NULL};
    Py_buffer data;
    int target;
    PyObject *budget = NULL;
    unsigned long long max_pixels = 0;
    if (!PyArg_ParseTupleAndKeywords(args, keywords, "y*i|O:add_restarts", names, &data, &target,
                                     &budget)) {
        return NULL;
    }
    if (!parse_budget(budget, &max_pixels)) {
        PyBuffer_Release(&data);
        return NULL;
    }
    if (target < 1 || target > 65535) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "the restart interval must be 1-65535 pixels");
        return NULL;
    }
    char message[JMSG_LENGTH_MAX];
    unsigned char *result = NULL;
    size_t result_size = 0;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = transcode((const unsigned char *)data.buf, (size_t)data.len, (unsigned int)target,
                       max_pixels, &result, &result_size, message);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (status != DONE) {
        return set_error(status, message);
    }
    PyObject *bytes = PyBytes_FromStringAndSize((const char *)result, (Py_ssize_t)result_size);
    free(result);
    return bytes;
}

static PyObject *sub_image(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_buffer data;
    Py_ssize_t x0, y0, x1, y1;
    if (!PyArg_ParseTuple(args, "y*nnnn:sub_image", &data, &x0, &y0, &x1, &y1)) {
        return NULL;
    }
    if (x0 < 0 || y0 < 0 || x1 < 0 || y1 < 0 || x0 > 65535 || y0 > 65535 || x1 > 65535
            || y1 > 65535) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "pixel bounds must be within 0-65535");
        return NULL;
    }
    unsigned char *sub = NULL;
    size_t size = 0;
    unsigned int origin_x = 0, origin_y = 0;
    int status = restart_subimage((const unsigned char *)data.buf, (size_t)data.len,
                                  (unsigned int)x0, (unsigned int)y0, (unsigned int)x1,
                                  (unsigned int)y1, &sub, &size, &origin_x, &origin_y);
    PyBuffer_Release(&data);
    if (status == NO_MEMORY) {
        return PyErr_NoMemory();
    }
    if (status != DONE) {
        Py_RETURN_NONE; /* no fitting layout */
    }
    PyObject *result = Py_BuildValue("y#II", (const char *)sub, (Py_ssize_t)size, origin_x,
                                     origin_y);
    free(sub);
    return result;
}

static PyObject *image_size(PyObject *Py_UNUSED(module), PyObject *data_object) {
    Py_buffer data;
    if (PyObject_GetBuffer(data_object, &data, PyBUF_SIMPLE) != 0) {
        return NULL;
    }
    unsigned int height = 0, width = 0;
    int found = frame_size((const unsigned char *)data.buf, (size_t)data.len, &height, &width);
    PyBuffer_Release(&data);
    if (!found) {
        Py_RETURN_NONE;
    }
    return Py_BuildValue("II", height, width);
}

static PyObject *restart_interval(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*:restart_interval", &data)) {
        return NULL;
    }
    RestartLayout layout = {0};
    int usable = restart_layout((const unsigned char *)data.buf, (size_t)data.len, &layout);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(usable ? layout.interval : 0);
}

static PyObject *decode_region(PyObject *Py_UNUSED(module), PyObject *args, PyObject *keywords) {
    static char *names[] = {"", "", "", "", "", "", "", "", "", "max_pixels", NULL};
    Py_buffer data, out;
    Py_ssize_t left, top, width, height;
    int scale, channels, fast_dct;
    PyObject *budget = NULL;
    unsigned long long max_pixels = 0;
    if (!PyArg_ParseTupleAndKeywords(args, keywords, "y*w*nnnniip|O:decode_region", names, &data,
                                     &out, &left, &top, &width, &height, &scale, &channels,
                                     &fast_dct, &budget)) {
        return NULL;
    }
    /* JPEG sides are at most 65,535: bounds that also keep every sum below from overflowing. */
    if ((scale != 1 && scale != 2 && scale != 4 && scale != 8) || (channels != 1 && channels != 3)
            || !PyBuffer_IsContiguous(&out, 'C') || left < 0 || top < 0 || width < 0
            || height < 0 || left > 65535 || top > 65535 || width > 65535 || height > 65535) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError,
                        "scale must be 1, 2, 4 or 8, channels 1 or 3, out C-contiguous, and the "
                        "window within 0-65535");
        return NULL;
    }
    if (!parse_budget(budget, &max_pixels)) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&out);
        return NULL;
    }
    char message[JMSG_LENGTH_MAX];
    JDIMENSION row = 0, dx = 0;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = decode_window((const unsigned char *)data.buf, (size_t)data.len,
                           (unsigned char *)out.buf, (size_t)out.len, (unsigned int)left,
                           (unsigned int)top, (unsigned int)width, (unsigned int)height,
                           (unsigned int)scale, channels, fast_dct, max_pixels, &row, &dx,
                           message);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (status != DONE) {
        return set_error(status, message);
    }
    return Py_BuildValue("II", row, dx);
}

static PyMethodDef methods[] = {
    {"decode_region", (PyCFunction)(void (*)(void))decode_region, METH_VARARGS | METH_KEYWORDS,
     "decode_region(data, out, left, top, width, height, scale, channels, fast_dct, "
     "max_pixels=0) -> (row, dx): decodes a window of a JPEG into out (see the module's "
     "source); PixelBudgetError if its frame declares more than max_pixels pixels (0: no "
     "budget)."},
    {"add_restarts", (PyCFunction)(void (*)(void))add_restarts, METH_VARARGS | METH_KEYWORDS,
     "add_restarts(data, target, max_pixels=0) -> bytes: the JPEG rewritten losslessly with a "
     "restart marker every N MCUs, N the largest divisor of its MCUs per row spanning at most "
     "target pixels. ValueError if libjpeg cannot (CMYK, damaged); PixelBudgetError before "
     "reading its coefficients (2 bytes per sample) if its frame declares more than max_pixels "
     "pixels (0: no budget)."},
    {"sub_image", sub_image, METH_VARARGS,
     "sub_image(data, x0, y0, x1, y1) -> (bytes, x, y) | None: the JPEG of the intervals "
     "covering pixels [x0, x1) x [y0, y1) and its origin, or None when data has no fitting "
     "restart layout (decode_region's fast path, exposed for tests). MemoryError if the copy "
     "cannot be allocated."},
    {"image_size", image_size, METH_O,
     "image_size(data) -> (height, width) | None: the JPEG frame's size from its SOF segment, "
     "or None if data is not a JPEG with one before its first scan (GIL held: ~0.2 us)."},
    {"restart_interval", restart_interval, METH_VARARGS,
     "restart_interval(data) -> int: the MCUs per restart interval when the JPEG's windows can "
     "be decoded from their intervals alone, else 0."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef definition = {
    PyModuleDef_HEAD_INIT, "_jpeg_region",
    "Region (ROI) decoding of JPEGs with libjpeg-turbo, for trainfeed's decode-stage crops.\n\n"
    "Every entry point that decodes takes max_pixels (0, the default: no budget) and raises "
    "PixelBudgetError, a ValueError, before allocating anything for a JPEG whose frame declares "
    "more pixels: 'the JPEG declares WxH pixels, over the budget of N'. Progressive files are "
    "refused the same way (their coefficient buffers are the big allocation), and so are files "
    "of more than 500 scans (ValueError).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jpeg_region(void) {
    PyObject *module = PyModule_Create(&definition);
    if (module == NULL) {
        return NULL;
    }
    if (PixelBudgetError == NULL) {
        PixelBudgetError = PyErr_NewExceptionWithDoc(
            "trainfeed.decode._jpeg_region.PixelBudgetError",
            "A JPEG declares more pixels than the decoder's max_pixels budget.",
            PyExc_ValueError, NULL);
        if (PixelBudgetError == NULL) {
            Py_DECREF(module);
            return NULL;
        }
    }
    Py_INCREF(PixelBudgetError);
    if (PyModule_AddObject(module, "PixelBudgetError", PixelBudgetError) < 0) {
        Py_DECREF(PixelBudgetError);
        Py_DECREF(module);
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "LIBJPEG_TURBO_VERSION_NUMBER",
                                LIBJPEG_TURBO_VERSION_NUMBER) < 0
            || PyModule_AddIntConstant(module, "MARGIN", REGION_MARGIN) < 0
            || PyModule_AddIntConstant(module, "MAX_SCANS", MAX_SCANS) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
#endif /* JPEG_REGION_NO_PYTHON */
