"""attn-circuits: attention-head composition in attention-only transformers.

The library behind the DVC stages: config schemas (`config`, `params`), the model
(`model`), data and training (`data`, `train`), checkpoints and analysis-ready
weights (`checkpoint`, `weights`), low-rank products and composition scores
(`strands`, `composition`), head classification (`patterns`, `heads`), figures.
"""
