// The nearest IQ4 level of a scaled weight: the one search IQ4_NL and
// IQ4_XS quantization repeats for every candidate scale (engine/model/
// quantize.cc). It must choose exactly as ggml's best_index_int8 does, so
// that the blocks we write are llama-quantize's byte for byte.
#ifndef TANDEM_ENGINE_MODEL_IQ4_LEVELS_H_
#define TANDEM_ENGINE_MODEL_IQ4_LEVELS_H_

#include <cstdint>

namespace tandem::model {

// The index (0..15) of the IQ4 level (kernels::kIq4NlLevels, ascending)
// nearest x: 0 at or below the first level, 15 at or above the last;
// between the levels lo <= x < hi that bracket x, lo's index when
// x - lo < hi - x in float, else hi's (a tie goes up).
int NearestIq4Level(float x);

// out[j] = NearestIq4Level(scale * x[j]) for j < 32, computed with the same
// float operations lane by lane (AVX-512, 16 at a time, where the build has
// it; NearestIq4Level otherwise).
void NearestIq4Levels32(float scale, const float* x, uint8_t* out);

}  // namespace tandem::model

#endif  // TANDEM_ENGINE_MODEL_IQ4_LEVELS_H_
