"""The data: a corpus read from a pinned package or local files (`corpus`), its BPE
tokenizer (`tokenizer`), and the batches, held-out windows and probes a seed draws
(`datasets`). Empty on purpose: each stage imports only the modules it uses."""
