"""Across seeds: reading each seed's outputs (`read`), the statistics and verdicts
(`stats`), and the claims in words (`claims`). Empty on purpose: each stage imports only
the modules it uses, so its DVC dependencies stay exact."""
