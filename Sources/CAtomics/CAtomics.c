// Everything lives in include/CAtomics.h as static inline functions.
