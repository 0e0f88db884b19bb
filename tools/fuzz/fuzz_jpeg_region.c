/* A libFuzzer harness for trainfeed's region decoder (trainfeed/decode/_jpeg_region.c): every
 * Python entry point's C core on each input, with the memory checks the Python side cannot see.
 *
 * Input: PARAMS bytes of parameters (scale, channels, DCT, window, restart target, buffer
 * slack), then the JPEG. tools/fuzz/seeds.py writes the seeds in that form, and
 * tools/sanitize_jpeg_region.sh builds and runs this with clang's -fsanitize=fuzzer,address,
 * undefined. The file is compiled in whole, without its Python part (JPEG_REGION_NO_PYTHON).
 *
 * Every decode gets a pixel budget (BUDGET): without one, a header alone can make libjpeg
 * allocate gigabytes (the budget's own test is tests/decode/test_jpeg_region_safety.py), and
 * libFuzzer would stop on its memory limit instead of exploring. */
#define JPEG_REGION_NO_PYTHON
#include "../../trainfeed/decode/_jpeg_region.c"

#include <stdint.h>

#define PARAMS 12
#define BUDGET (1u << 20) /* pixels; larger only slows each input down */
#define LARGEST_WINDOW 2048 /* pixels a side, when the frame's size is unknown */

static unsigned int u16(const uint8_t *at) { return ((unsigned int)at[0] << 8) | at[1]; }

/* decode_region's core on one window, into a buffer of exactly the size the Python side
 * allocates (less `slack`: the too-small check), so that ASan sees any byte written past it. */
static void decode_into_exact_buffer(const unsigned char *data, size_t size, unsigned int left,
                                     unsigned int top, unsigned int width, unsigned int height,
                                     unsigned int k, int channels, int fast_dct, size_t slack) {
    size_t capacity = (size_t)height * (width + REGION_MARGIN) * channels;
    capacity = capacity > slack ? capacity - slack : 1;
    unsigned char *out = malloc(capacity);
    if (out == NULL) {
        return;
    }
    char message[JMSG_LENGTH_MAX];
    JDIMENSION row = 0, dx = 0;
    if (decode_window(data, size, out, capacity, left, top, width, height, k, channels,
                      fast_dct, BUDGET, &row, &dx, message) == DONE
            && ((size_t)row * height * channels > capacity || dx > REGION_MARGIN
                || row < width + dx)) {
        abort(); /* rows that do not fit, or a window outside them */
    }
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *input, size_t length) {
    if (length < PARAMS) {
        return 0;
    }
    const uint8_t *p = input;
    const unsigned char *data = input + PARAMS;
    size_t size = length - PARAMS;
    unsigned int k = 1u << (p[0] & 3);
    int channels = p[0] & 4 ? 1 : 3, fast_dct = (p[0] >> 3) & 1;
    size_t slack = p[0] & 0x10 ? p[11] : 0;

    /* image_size and restart_interval */
    unsigned int frame_height = 0, frame_width = 0;
    int framed = frame_size(data, size, &frame_height, &frame_width);
    RestartLayout layout = {0};
    restart_layout(data, size, &layout);

    /* A window within the scaled frame when there is one (else anywhere, up to a size). */
    unsigned int scaled_width = framed ? ceil_div(frame_width, k) : LARGEST_WINDOW;
    unsigned int scaled_height = framed ? ceil_div(frame_height, k) : LARGEST_WINDOW;
    unsigned int left = u16(p + 1) % scaled_width, top = u16(p + 3) % scaled_height;
    unsigned int width = 1 + u16(p + 5) % (scaled_width - left);
    unsigned int height = 1 + u16(p + 7) % (scaled_height - top);
    width = width < LARGEST_WINDOW ? width : LARGEST_WINDOW;
    height = height < LARGEST_WINDOW ? height : LARGEST_WINDOW;

    /* decode_region */
    decode_into_exact_buffer(data, size, left, top, width, height, k, channels, fast_dct, slack);

    /* sub_image: never more than the input and SOI, EOI */
    unsigned char *sub = NULL;
    size_t sub_size = 0;
    unsigned int origin_x = 0, origin_y = 0;
    if (restart_subimage(data, size, left * k, top * k, (left + width) * k, (top + height) * k,
                         &sub, &sub_size, &origin_x, &origin_y) == DONE) {
        if (sub_size > size + 4 || origin_x > left * k || origin_y > top * k) {
            abort();
        }
        free(sub);
    }

    /* add_restarts, and the rewritten file's window (its restart intervals: the fast path) */
    unsigned char *rewritten = NULL;
    size_t rewritten_size = 0;
    char message[JMSG_LENGTH_MAX];
    if (transcode(data, size, 1 + 4u * p[9], BUDGET, &rewritten, &rewritten_size, message)
            == DONE) {
        decode_into_exact_buffer(rewritten, rewritten_size, left, top, width, height, k,
                                 channels, fast_dct, 0);
        free(rewritten);
    }
    return 0;
}
