#ifndef VLM_JPEG_PROBE_H
#define VLM_JPEG_PROBE_H

#include <stddef.h>
#include <stdint.h>

/// Whether libjpeg, reading `data` through a suspending source as Pillow's decoder does (every byte given, then no
/// more), outputs every scanline: 1 if it does, 0 if it stops for more input first (Pillow: "image file is
/// truncated"), -1 if libjpeg gives up on the data, or where this build has no libjpeg (outside Linux).
int vlm_jpeg_scanlines_complete(const uint8_t *data, size_t size);

#endif
