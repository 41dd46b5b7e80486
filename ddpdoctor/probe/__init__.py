"""`ddpdoctor probe`: launch real ranks, run small real collectives and training steps, and prove that
every rank agrees with a single-process reference -- or name the rank that does not, hangs, or dies.

Importing this package must not import torch: the linter is installed without it.
"""
