"""What the files say: study and objective TOML files read into validated, frozen dataclasses."""
