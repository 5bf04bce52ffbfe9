#include "device/sequencer.h"
