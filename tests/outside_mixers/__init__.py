"""A package that is not part of linbench, holding a mixer of its own: what a researcher's
package looks like when it puts a new mixer beside the zoo (tests/test_outside_mixer.py)."""
