-- Building this library makes sure Mathlib's compiled files are present, so the REPL
-- imports them instead of elaborating Mathlib itself.
import Mathlib
import Aesop
