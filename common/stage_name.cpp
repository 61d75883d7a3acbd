// Compiled once per suite by common/stage.mk, with -DATTENTION_STAGE_NAME='"<suite>"'.
#include "stage_name.h"

const char* attention_stage_name() { return ATTENTION_STAGE_NAME; }
