"""Across seeds: reading each seed's outputs (`read`), the errata's claims, each with its words
and its per-seed statistics (`claims`), and the long table, intervals and verdicts (`stats`).
Empty on purpose: each stage imports only the modules it uses, so its DVC dependencies stay
exact."""
