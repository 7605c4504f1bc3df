"""The `mmpreproj` command's experiments, on top of train / eval / analysis: `reproduce` (the paper's Table 2
over seeds), `sweep` (learning rates), `budget` (methods at equal parameter budgets), their shared arm
(`arms`), the paper's figures (`paper`) and the markdown reports (`report_md`)."""
