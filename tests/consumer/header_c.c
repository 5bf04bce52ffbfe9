/* The public header must compile alone as C11. */
#include <taiji/taiji.h>
int taiji_header_compiles_as_c(void) { return TAIJI_OK; }
