"""The `mmpreproj` command's light entry point (`command.main`): its parser, argument checks and the tables they show.

Nothing here imports torch, peft or transformers, so `mmpreproj --help` and a wrong argument answer without
loading them; `main` imports the library (`mmpreproj.cli.run`) only when a subcommand runs. The library reads
its method, preset and option names from `tables`, so the command and the library name each of them once.
"""
