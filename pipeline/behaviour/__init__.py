"""What the heads do when the model runs: their roles (`heads`), ablations (`ablation`),
whether composition agrees with the ablations (`agreement`), and the checkpoints over
training (`dynamics`, `phases`). Empty on purpose: each stage imports only the modules it
uses."""
