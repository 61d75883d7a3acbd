#pragma once

// The name of the suite being built: its folder, or STAGE= of its Makefile. It comes from a
// tiny object compiled per suite (stage_name.cpp), so that the shared harness, test and
// benchmark objects hold nothing stage-specific and are compiled once for every stage.
const char* attention_stage_name();
