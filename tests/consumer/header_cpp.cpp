// The public header must compile alone as C++20.
#include <taiji/taiji.h>
int taiji_header_compiles_as_cpp() { return TAIJI_OK; }
