/* simd_fold: how the transposing folds (fold8x8 in simd256.h, fold16x16 in simd512.h) combine
 * lanes: SIMD_FOLD_ADD_I32 adds int32 lanes carried as float bit patterns (cast in and out). */
#ifndef QUERN_SIMD_FOLD_H
#define QUERN_SIMD_FOLD_H

enum simd_fold { SIMD_FOLD_ADD, SIMD_FOLD_MAX, SIMD_FOLD_ADD_I32 };

#endif
