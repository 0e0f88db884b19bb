/* Decodes one rectangle of a JPEG with libjpeg-turbo, and nothing below it.
 *
 * Why this exists: a RandomResizedCrop keeps on average under half of an image (scale 0.08-1),
 * and the crop is all the trainer sees. libjpeg-turbo can decode a region: rows above it are
 * skipped (entropy-decoded only, no IDCT, upsampling or colour conversion: jpeg_skip_scanlines),
 * columns outside it are not reconstructed (jpeg_crop_scanline, to the iMCU boundary at its
 * left), and decoding stops after its last row. This is what tf.data's decode_and_crop_jpeg and
 * DALI's ROI decoder do; no maintained Python binding offers it (docs/imagenet.md), so this is a
 * thin wrapper of the libjpeg API: the Python side (trainfeed/worker/roi.py) plans the window,
 * resizes and flips.
 *
 * decode_region(data, out, left, top, width, height, scale, channels, fast_dct) -> (row, dx)
 *   data:     the JPEG (any object with the buffer protocol)
 *   out:      a writable, C-contiguous buffer of at least height * (width + 64) * channels bytes
 *   left, top, width, height: the window, in pixels of the image scaled by 1/scale
 *   scale:    1, 2, 4 or 8 (libjpeg's DCT-domain scaling)
 *   channels: 3 (RGB) or 1 (grey)
 * Writes `height` rows of `row` pixels each, contiguous; the window's first column is column
 * `dx` of them (the region starts at an iMCU boundary). Raises ValueError with libjpeg's message
 * on damaged data: warnings are errors here, as in simplejpeg's strict mode, so a flipped byte
 * never turns into silently wrong pixels. The GIL is released while decoding.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>

#ifndef LIBJPEG_TURBO_VERSION_NUMBER
#error "trainfeed's region decoder needs libjpeg-turbo (jpeg_crop_scanline, jpeg_skip_scanlines)"
#endif

/* How far jpeg_crop_scanline may move the left edge (an iMCU is at most 32 pixels wide at
 * 4:1:1 sampling) plus EDGE on both sides: the caller's margin. */
#define REGION_MARGIN 64
/* Pixels decoded beyond the window on either side (see decode). */
#define EDGE 4

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

static int decode(const unsigned char *data, size_t size, unsigned char *out, size_t capacity,
                  JDIMENSION left, JDIMENSION top, JDIMENSION width, JDIMENSION height,
                  unsigned int scale, int channels, int fast_dct, JDIMENSION *row,
                  JDIMENSION *dx, char *message) {
    struct jpeg_decompress_struct info;
    StrictErrors errors;
    volatile int created = 0;

    info.err = jpeg_std_error(&errors.manager);
    errors.manager.error_exit = fail;
    errors.manager.emit_message = warn_as_error;
    errors.message[0] = '\0';
    if (setjmp(errors.escape)) {
        if (created) {
            jpeg_destroy_decompress(&info);
        }
        snprintf(message, JMSG_LENGTH_MAX, "%s", errors.message);
        return -1;
    }
    jpeg_create_decompress(&info);
    created = 1;
    jpeg_mem_src(&info, data, (unsigned long)size);
    jpeg_read_header(&info, TRUE);
    if (info.jpeg_color_space == JCS_CMYK || info.jpeg_color_space == JCS_YCCK) {
        jpeg_destroy_decompress(&info);
        snprintf(message, JMSG_LENGTH_MAX, "CMYK JPEGs are decoded whole");
        return -1;
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
        jpeg_destroy_decompress(&info);
        return -1;
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
    if ((size_t)cropped * height * channels > capacity || left - offset > REGION_MARGIN / 2 + EDGE) {
        snprintf(message, JMSG_LENGTH_MAX, "region buffer too small for %u columns", cropped);
        jpeg_destroy_decompress(&info);
        return -1;
    }
    if (top > 0 && jpeg_skip_scanlines(&info, top) != top) {
        snprintf(message, JMSG_LENGTH_MAX, "could not skip to row %u", top);
        jpeg_destroy_decompress(&info);
        return -1;
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
            jpeg_destroy_decompress(&info);
            return -1;
        }
        done += got;
    }
    /* The rows below the window are never decoded. */
    jpeg_abort_decompress(&info);
    jpeg_destroy_decompress(&info);
    *row = cropped;
    *dx = left - offset;
    return 0;
}

static PyObject *decode_region(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_buffer data, out;
    Py_ssize_t left, top, width, height;
    int scale, channels, fast_dct;
    if (!PyArg_ParseTuple(args, "y*w*nnnniip:decode_region", &data, &out, &left, &top, &width,
                          &height, &scale, &channels, &fast_dct)) {
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
    char message[JMSG_LENGTH_MAX];
    JDIMENSION row = 0, dx = 0;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = decode((const unsigned char *)data.buf, (size_t)data.len, (unsigned char *)out.buf,
                    (size_t)out.len, (JDIMENSION)left, (JDIMENSION)top, (JDIMENSION)width,
                    (JDIMENSION)height, (unsigned int)scale, channels, fast_dct, &row, &dx,
                    message);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (status != 0) {
        PyErr_SetString(PyExc_ValueError, message);
        return NULL;
    }
    return Py_BuildValue("II", row, dx);
}

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS,
     "decode_region(data, out, left, top, width, height, scale, channels, fast_dct) -> "
     "(row, dx): decodes a window of a JPEG into out (see the module's source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef definition = {
    PyModuleDef_HEAD_INIT, "_jpeg_region",
    "Region (ROI) decoding of JPEGs with libjpeg-turbo, for trainfeed's decode-stage crops.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jpeg_region(void) {
    PyObject *module = PyModule_Create(&definition);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "LIBJPEG_TURBO_VERSION_NUMBER",
                                LIBJPEG_TURBO_VERSION_NUMBER) < 0
            || PyModule_AddIntConstant(module, "MARGIN", REGION_MARGIN) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
