"""The Triton backend's shared machinery: a low-overhead launcher (``launch``) and programmatic
dependent launch (``pdl``). The kernels themselves live in each op family's ``triton_kernels``."""
