#include "device/device_executor.h"
