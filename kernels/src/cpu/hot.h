// Marks the CPU backend's hot loops: compiled twice, for x86-64-v3 (AVX2 + FMA) and for the
// baseline, with the loader picking one; every other machine gets the plain build.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SMLA_CPU_HOT __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define SMLA_CPU_HOT
#endif
