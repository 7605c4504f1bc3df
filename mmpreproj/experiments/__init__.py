"""The `mmpreproj` command's experiments, on top of train / eval / analysis: `reproduce` (the paper's Table 2
over seeds), `sweep` (learning rates), `budget` (methods at equal parameter budgets) and `study` (each method at its
own held-out LR, shared by workers), all front ends of one `runner` (LR search, the arm on a shared base, claims);
one arm and its record (`arms`), the paper's figures (`paper`) and the markdown reports (`report_md`)."""
