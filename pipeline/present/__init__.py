"""What a reader sees: the figures (`figures/`, one module per subject) and the
self-contained HTML report (`report`). Empty on purpose: each stage imports only the
modules it uses."""
