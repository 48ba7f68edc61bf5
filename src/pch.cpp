// Empty: the translation unit that carries the shared precompiled <torch/torch.h>.
