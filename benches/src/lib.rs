//! Benchmark support (filled in by the benchmark work).
