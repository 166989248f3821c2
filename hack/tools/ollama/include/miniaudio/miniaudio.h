/*
 * A stand-in for miniaudio (https://miniaud.io), which Ollama's module zip
 * does not carry (llama/llama.cpp/vendor/ is omitted) and Debian 12 does not
 * package. llama.cpp's mtmd-helper.cpp uses miniaudio only to decode audio
 * input for multimodal models; every decoder call here fails, so such input
 * is rejected ("Unable to read WAV audio file from buffer") and nothing else
 * changes. Only the declarations mtmd-helper.cpp uses are provided.
 *
 * Part of Model Orchestra's pinned Ollama build (hack/tools/ollama).
 */
#ifndef MO_MINIAUDIO_STUB_H
#define MO_MINIAUDIO_STUB_H

#include <stddef.h>
#include <stdint.h>

#ifndef MA_API
#define MA_API
#endif

typedef uint32_t ma_uint32;
typedef uint64_t ma_uint64;

typedef enum {
	MA_SUCCESS = 0,
	MA_ERROR = -1,
	MA_NOT_IMPLEMENTED = -29
} ma_result;

typedef enum {
	ma_format_unknown = 0,
	ma_format_u8 = 1,
	ma_format_s16 = 2,
	ma_format_s24 = 3,
	ma_format_s32 = 4,
	ma_format_f32 = 5
} ma_format;

typedef enum {
	ma_encoding_format_unknown = 0,
	ma_encoding_format_wav
} ma_encoding_format;

typedef struct {
	ma_format format;
	ma_uint32 channels;
	ma_uint32 sampleRate;
} ma_decoder_config;

typedef struct {
	int unused;
} ma_decoder;

typedef struct {
	ma_encoding_format encodingFormat;
	ma_format format;
	ma_uint32 channels;
	ma_uint32 sampleRate;
} ma_encoder_config;

typedef struct {
	int unused;
} ma_encoder;

#ifdef MINIAUDIO_IMPLEMENTATION

MA_API ma_decoder_config ma_decoder_config_init(ma_format format, ma_uint32 channels, ma_uint32 sampleRate)
{
	ma_decoder_config c;
	c.format = format;
	c.channels = channels;
	c.sampleRate = sampleRate;
	return c;
}

MA_API ma_result ma_decoder_init_memory(const void *data, size_t size, const ma_decoder_config *config, ma_decoder *decoder)
{
	(void)data; (void)size; (void)config; (void)decoder;
	return MA_NOT_IMPLEMENTED;
}

MA_API ma_result ma_decoder_get_length_in_pcm_frames(ma_decoder *decoder, ma_uint64 *length)
{
	(void)decoder;
	if (length) *length = 0;
	return MA_NOT_IMPLEMENTED;
}

MA_API ma_result ma_decoder_read_pcm_frames(ma_decoder *decoder, void *frames, ma_uint64 count, ma_uint64 *read)
{
	(void)decoder; (void)frames; (void)count;
	if (read) *read = 0;
	return MA_NOT_IMPLEMENTED;
}

MA_API ma_result ma_decoder_uninit(ma_decoder *decoder)
{
	(void)decoder;
	return MA_SUCCESS;
}

MA_API ma_encoder_config ma_encoder_config_init(ma_encoding_format encodingFormat, ma_format format, ma_uint32 channels, ma_uint32 sampleRate)
{
	ma_encoder_config c;
	c.encodingFormat = encodingFormat;
	c.format = format;
	c.channels = channels;
	c.sampleRate = sampleRate;
	return c;
}

MA_API ma_result ma_encoder_init_file(const char *path, const ma_encoder_config *config, ma_encoder *encoder)
{
	(void)path; (void)config; (void)encoder;
	return MA_NOT_IMPLEMENTED;
}

MA_API ma_result ma_encoder_write_pcm_frames(ma_encoder *encoder, const void *frames, ma_uint64 count, ma_uint64 *written)
{
	(void)encoder; (void)frames; (void)count;
	if (written) *written = 0;
	return MA_NOT_IMPLEMENTED;
}

MA_API void ma_encoder_uninit(ma_encoder *encoder)
{
	(void)encoder;
}

#endif /* MINIAUDIO_IMPLEMENTATION */
#endif /* MO_MINIAUDIO_STUB_H */
