"""The circuits, read from the weights alone: analysis-ready head weights (`weights`),
low-rank products (`strands`), the composition measures (`composition`, `invariant`) with
what they share (`scoring`), and their calibrated significance (`significance`).
Pure maths on weights: nothing here imports `model/` or `data/` (a test says so). Empty
on purpose: each stage imports only the modules it uses."""
