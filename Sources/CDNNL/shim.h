#include <oneapi/dnnl/dnnl.h>
