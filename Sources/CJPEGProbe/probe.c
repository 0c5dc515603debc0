// Pillow's JPEG decoder feeds libjpeg through a suspending source and stops once the last scanline is out: a file
// whose scans are complete decodes even without its end-of-image marker, one that ends sooner does not, and a
// progressive or multi-scan file, which libjpeg absorbs up to that marker before its first scanline, needs the
// marker. libturbojpeg's one-call API cannot tell these apart, so libjpeg's own API answers here. libjpeg reports
// fatal errors by calling error_exit, which must not return: that takes setjmp/longjmp, hence C.

#include "vlm_jpeg_probe.h"

#if defined(__linux__) && __has_include(<jpeglib.h>)

#include <setjmp.h>
#include <stdio.h>
#include <jpeglib.h>

typedef struct {
    struct jpeg_error_mgr base;
    jmp_buf escape;
} probe_error;

static void escape(j_common_ptr info) { longjmp(((probe_error *)info->err)->escape, 1); }
static void silent(j_common_ptr info) { (void)info; }
static void start_source(j_decompress_ptr info) { (void)info; }
static void end_source(j_decompress_ptr info) { (void)info; }
// Every byte is in the buffer from the start: asking for more means the data ended. Suspend, as Pillow's source
// does at the end of the file.
static boolean no_more_input(j_decompress_ptr info) { (void)info; return FALSE; }

static void skip_input(j_decompress_ptr info, long count) {
    struct jpeg_source_mgr *source = info->src;
    if (count <= 0) return;
    size_t skipped = (size_t)count < source->bytes_in_buffer ? (size_t)count : source->bytes_in_buffer;
    source->next_input_byte += skipped;
    source->bytes_in_buffer -= skipped;
}

int vlm_jpeg_scanlines_complete(const uint8_t *data, size_t size) {
    struct jpeg_decompress_struct info;
    probe_error error;
    info.err = jpeg_std_error(&error.base);
    error.base.error_exit = escape;
    error.base.output_message = silent;
    if (setjmp(error.escape)) {
        jpeg_destroy_decompress(&info);
        return -1;
    }
    jpeg_create_decompress(&info);
    struct jpeg_source_mgr source = {
        .next_input_byte = data, .bytes_in_buffer = size, .init_source = start_source,
        .fill_input_buffer = no_more_input, .skip_input_data = skip_input, .resync_to_restart = jpeg_resync_to_restart,
        .term_source = end_source,
    };
    info.src = &source;
    int complete = 0;
    if (jpeg_read_header(&info, TRUE) == JPEG_HEADER_OK && jpeg_start_decompress(&info)) {
        JSAMPARRAY row = (*info.mem->alloc_sarray)((j_common_ptr)&info, JPOOL_IMAGE,
                                                   info.output_width * info.output_components, 1);
        while (info.output_scanline < info.output_height && jpeg_read_scanlines(&info, row, 1) == 1) {}
        complete = info.output_scanline == info.output_height;
    }
    jpeg_destroy_decompress(&info);
    return complete;
}

#else

int vlm_jpeg_scanlines_complete(const uint8_t *data, size_t size) {
    (void)data;
    (void)size;
    return -1;
}

#endif
