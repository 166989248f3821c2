//go:build amd64 && !purego

#include "textflag.h"

// The long-input loop of XXH3-64 fused with a copy: every 64-byte stripe of
// src is loaded into two YMM registers once, stored to dst and accumulated
// from the same registers. Y0 holds lanes 0-3 of the accumulator, Y1 lanes
// 4-7; Y15 holds PRIME32_1 in each 64-bit lane for the scramble.
//
// SI: src, DI: dst, DX: secret, CX: blocks left.

// STRIPE copies and accumulates the stripe at off with the secret at key:
// for each 64-bit lane i, acc[i^1] += v[i] and
// acc[i] += lo32(v[i]^k[i]) * hi32(v[i]^k[i]).
#define STRIPE(off, key, STORE) \
	VMOVDQU  off(SI), Y2; \
	VMOVDQU  off+32(SI), Y3; \
	STORE    Y2, off(DI); \
	STORE    Y3, off+32(DI); \
	VPXOR    key(DX), Y2, Y4; \
	VPXOR    key+32(DX), Y3, Y5; \
	VPSHUFD  $0x4e, Y2, Y2; \
	VPSHUFD  $0x4e, Y3, Y3; \
	VPADDQ   Y2, Y0, Y0; \
	VPADDQ   Y3, Y1, Y1; \
	VPSRLQ   $32, Y4, Y6; \
	VPSRLQ   $32, Y5, Y7; \
	VPMULUDQ Y4, Y6, Y4; \
	VPMULUDQ Y5, Y7, Y5; \
	VPADDQ   Y4, Y0, Y0; \
	VPADDQ   Y5, Y1, Y1

// SCRAMBLE1 scrambles the four lanes in acc with the secret at key:
// acc ^= acc >> 47; acc ^= k; acc *= PRIME32_1 (64-bit product, as
// lo32(acc)*p + (hi32(acc)*p) << 32).
#define SCRAMBLE1(acc, key) \
	VPSRLQ   $47, acc, Y4; \
	VPXOR    Y4, acc, acc; \
	VPXOR    key(DX), acc, acc; \
	VPMULUDQ Y15, acc, Y4; \
	VPSRLQ   $32, acc, acc; \
	VPMULUDQ Y15, acc, acc; \
	VPSLLQ   $32, acc, acc; \
	VPADDQ   Y4, acc, acc

#define BLOCK(STORE) \
	STRIPE(0, 0, STORE); \
	STRIPE(64, 8, STORE); \
	STRIPE(128, 16, STORE); \
	STRIPE(192, 24, STORE); \
	STRIPE(256, 32, STORE); \
	STRIPE(320, 40, STORE); \
	STRIPE(384, 48, STORE); \
	STRIPE(448, 56, STORE); \
	STRIPE(512, 64, STORE); \
	STRIPE(576, 72, STORE); \
	STRIPE(640, 80, STORE); \
	STRIPE(704, 88, STORE); \
	STRIPE(768, 96, STORE); \
	STRIPE(832, 104, STORE); \
	STRIPE(896, 112, STORE); \
	STRIPE(960, 120, STORE); \
	SCRAMBLE1(Y0, 128); \
	SCRAMBLE1(Y1, 160)

#define PROLOGUE \
	MOVQ         dst+0(FP), DI; \
	MOVQ         src+8(FP), SI; \
	MOVQ         secret+16(FP), DX; \
	MOVQ         blocks+24(FP), CX; \
	MOVQ         acc+32(FP), AX; \
	VMOVDQU      (AX), Y0; \
	VMOVDQU      32(AX), Y1; \
	MOVQ         $2654435761, BX; \
	MOVQ         BX, X15; \
	VPBROADCASTQ X15, Y15

#define EPILOGUE \
	VMOVDQU Y0, (AX); \
	VMOVDQU Y1, 32(AX); \
	VZEROUPPER

// func copyBlocksNT(dst, src, secret *byte, blocks int, acc *[8]uint64)
// dst must be 32-byte aligned.
TEXT ·copyBlocksNT(SB), NOSPLIT, $0-40
	PROLOGUE
	TESTQ CX, CX
	JZ    ntdone

ntloop:
	BLOCK(VMOVNTDQ)
	ADDQ $1024, SI
	ADDQ $1024, DI
	DECQ CX
	JNZ  ntloop

ntdone:
	SFENCE
	EPILOGUE
	RET

// func copyBlocks(dst, src, secret *byte, blocks int, acc *[8]uint64)
TEXT ·copyBlocks(SB), NOSPLIT, $0-40
	PROLOGUE
	TESTQ CX, CX
	JZ    done

loop:
	BLOCK(VMOVDQU)
	ADDQ $1024, SI
	ADDQ $1024, DI
	DECQ CX
	JNZ  loop

done:
	EPILOGUE
	RET
