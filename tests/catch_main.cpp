/**
 * @file catch_main.cpp
 * @brief Catch2's main(), compiled from its header. Used instead of Debian's prebuilt
 *        libCatch2WithMain.a when MHAR_HEADER_ONLY_DEPS is on (the top CMakeLists.txt says why).
 */
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
