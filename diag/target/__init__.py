"""The target model: loading checkpoints, capture, generation, teacher-forced passes and their
cache, quantization regimes applied, placement on GPUs."""
