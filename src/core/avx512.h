// <immintrin.h> for the *_avx512.cc kernel files. GCC 12's AVX-512 intrinsics start some results
// from undefined values, which its -Wuninitialized and -Wmaybe-uninitialized report at every use
// (GCC bug 105593, fixed in GCC 13), so the including file does without those two warnings.
#pragma once

#include <immintrin.h>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
