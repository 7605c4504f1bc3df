"""The `mmpreproj` command: its light entry point (`command.main`), parser and argument checks, and `run`, the
subcommands.

Nothing here imports torch, peft or transformers at the top, so `mmpreproj --help` and a wrong argument answer
without loading them: the parser and the checks read the plain tables of `mmpreproj_tables`, and `main` imports
`run` only when a subcommand runs; each subcommand of `run` imports the library's modules it runs inside its
function. The library reads the same tables, so the command and the library name each fact once.
"""
