"""The plain data and rules both the library and the command read, each written once: the method table, the
presets and every option's choices (`tables`), the numeric ranges and list parsers (`values`), where a name for a
model, data or an adapter points (`sources`), the models shipped in packages (`packaged`) and the hub's offline
flags (`offline`).

The bottom of the project: standard library only, and it imports nothing of `mmpreproj` or `mmpreproj_cli`; both
import it. It is a package of its own, not a folder of `mmpreproj`, because importing any submodule of `mmpreproj`
first runs `mmpreproj/__init__.py`, which loads torch and peft to register the PREPROJ method with peft (a bare
`import mmpreproj` must make `PeftModel.from_pretrained` read our adapters): a table inside the library could not
be read without torch, and `mmpreproj --help` and a refused argument answer without it (`tests/test_cli_light.py`).
"""
