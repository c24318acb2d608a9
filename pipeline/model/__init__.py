"""The model: the attention-only transformer (`transformer`), training it (`train`), where
a seed's model comes from (`origin`), TransformerLens checkpoints (`tl_checkpoint`) and the
attention-pattern scores training and the heads stage share (`patterns`). Empty on purpose:
each stage imports only the modules it uses."""
