"""Training EAGLE-1/2 draft heads by self-distillation (`eaglechat train`); one stage per module."""
