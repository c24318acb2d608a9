"""attn-circuits: attention-head composition in attention-only transformers.

The library behind the DVC stages, in the order the data travels:

- `data/`: the corpus, its tokenizer, and the batches a seed draws (`datasets`);
- `model/`: the transformer (`transformer`), training (`train`), where a model comes from
  (`origin`), TransformerLens checkpoints (`tl_checkpoint`) and attention-pattern scores;
- `circuits/`: analysis-ready weights and the composition measures on them (`weights`,
  `strands`, `composition`, `invariant`, `scoring`, `significance`); pure maths on weights,
  it never imports `model/` or `data/`;
- `behaviour/`: what the heads do on text (`heads`, `ablation`, `channel_check`, `agreement`,
  `dynamics`, `phases`);
- `compare/`: the claims across seeds; `present/`: figures and the HTML report;
- `api`: one model in a notebook (`attn_circuits.api`: a TransformerLens model, a state dict or a
  path in, pandas tables out), on the stages' own functions; nothing imports it;

all over a ground of shared modules: `errors`, `io`, `cli`, `config`, `params`, `tables`,
`streams`, `memory`, `checkpoint`, `hub`. No module imports one on a floor above its own.
Each subpackage's `__init__.py` is a docstring only: importing a stage's modules imports
nothing else, so each stage's DVC dependencies stay exact.
"""
